"""Writes a benchmark's JSON results (bench/results/*.json) as Markdown tables:
scalars as a key | value table; a list of records, or a mapping of names to
records, as one table with a row per record and a column per field; deeper
levels under their own headings.

    python bench/markdown.py bench/results/throughput.json > bench/results/throughput.md
"""
import json
import pathlib
import sys


def cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(cell(x) for x in v) if all(not isinstance(x, (dict, list)) for x in v) else "…"
    if v is None:
        return ""
    return str(v).replace("|", "\\|").replace("\n", " ")


def is_record(v) -> bool:
    """A dict whose values are scalars or lists of scalars."""
    return isinstance(v, dict) and v and all(
        not isinstance(x, dict) and not (isinstance(x, list) and any(isinstance(y, (dict, list)) for y in x))
        for x in v.values())


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def records(named: list[tuple[str, dict]], name_column: str) -> str:
    fields: list[str] = []
    for _, r in named:
        fields += [k for k in r if k not in fields]
    header = ([name_column] if name_column else []) + fields
    rows = [([name] if name_column else []) + [cell(r.get(f)) for f in fields] for name, r in named]
    return table(header, rows)


def render(data, title: str, level: int = 1) -> str:
    out = f"{'#' * min(level, 6)} {title}\n\n"
    if isinstance(data, list):
        if all(is_record(x) for x in data):
            return out + records([("", x) for x in data], "")
        return out + table(["value"], [[cell(x)] for x in data])
    scalars = {k: v for k, v in data.items() if not isinstance(v, (dict, list)) or
               (isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v))}
    if scalars:
        out += table(["", "value"], [[k, cell(v)] for k, v in scalars.items()]) + "\n"
    nested = {k: v for k, v in data.items() if k not in scalars}
    named_records = [(k, v) for k, v in nested.items() if is_record(v)]
    if len(named_records) > 1:
        out += records(named_records, "name") + "\n"
        nested = {k: v for k, v in nested.items() if not is_record(v)}
    for k, v in nested.items():
        out += render(v, k, level + 1)
    return out


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit("usage: markdown.py RESULTS.json")
    path = pathlib.Path(sys.argv[1])
    sys.stdout.write(render(json.loads(path.read_text()), f"bench/results/{path.name}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
