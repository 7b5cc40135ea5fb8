// Anchors the shared precompiled header target (see CMakeLists.txt).
