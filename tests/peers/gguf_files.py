"""GGUF files written by ggml's own Python package (gguf), for test_gguf.

Writes into OUT:
  types.gguf        metadata of every value type (nested arrays too) and one
                    tensor of each type tightfit decodes, quantized by gguf's
                    quantizers (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)
                    or, for the K-quants (which gguf cannot quantize), random
                    blocks with finite scales (Q4_K, Q5_K, Q6_K)
  expected.safetensors  each tensor as gguf.quants.dequantize gives it (float32)
  metadata.json     the metadata as gguf's GGUFReader reads it back
  v2.gguf           a version-2 file (32-bit lengths are v1; v2 is 64-bit as v3)
  aligned.gguf      general.alignment = 64
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

import gguf
from gguf import GGMLQuantizationType as T

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)


def k_quant_blocks(rng, qtype, n_blocks):
    """Random blocks of a K-quant with each float16 scale finite."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    halves = {T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}[qtype]
    for at in halves:
        raw[:, at:at + 2] = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


def write(path, alignment=None, version_2=False):
    rng = np.random.default_rng(7)  # the same tensors in every file
    w = gguf.GGUFWriter(str(path), arch="llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("test.u8", 250)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 65000)
    w.add_int16("test.i16", -32000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float32("test.f32", 0.1)
    w.add_float64("test.f64", 0.1)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo {{ messages }}")
    w.add_array("test.strings", ["a", "", "ü", "<|im_start|>"])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.nested", [[1, 2], [3]])
    expected = {}
    shape = (3, 512)  # rows x columns: ne0 = 512 (two K-quant super-blocks a row)
    for qtype in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]:
        name = f"t.{qtype.name.lower()}"
        if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = k_quant_blocks(rng, qtype, shape[0] * shape[1] // block).reshape(shape[0], -1)
        else:
            data = rng.standard_normal(shape).astype(np.float32)
            data[0, :32] = 0.0  # an all-zero block
            raw = data if qtype == T.F32 else gguf.quants.quantize(data, qtype)
        if qtype == T.F32:
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        expected[name] = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(raw, qtype).astype(np.float32)))
    # A 1-D and a 3-D tensor: the shape order (ne0 fastest).
    vec = rng.standard_normal(64).astype(np.float32)
    w.add_tensor("t.vector", vec)
    expected["t.vector"] = torch.from_numpy(vec)
    cube = rng.standard_normal((2, 3, 32)).astype(np.float32)
    w.add_tensor("t.cube", cube)
    expected["t.cube"] = torch.from_numpy(cube)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version_2:  # the header's version field (bytes 4..7); the layout is v3's
        b = bytearray(path.read_bytes())
        b[4:8] = (2).to_bytes(4, "little")
        path.write_bytes(bytes(b))
    return expected


expected = write(out / "types.gguf")
save_file(expected, str(out / "expected.safetensors"))
write(out / "v2.gguf", version_2=True)
write(out / "aligned.gguf", alignment=64)

# The metadata as gguf's reader reads it back, and where the data begins.
r = gguf.GGUFReader(str(out / "types.gguf"))
meta = {}
for field in r.fields.values():
    if not field.name.startswith("test."):
        continue
    meta[field.name] = field.contents()
meta["__data_offset__"] = int(r.data_offset)
meta["__tensors__"] = {t.name: {"type": t.tensor_type.name, "shape": [int(d) for d in t.shape]} for t in r.tensors}
(out / "metadata.json").write_text(json.dumps(meta, ensure_ascii=False))
