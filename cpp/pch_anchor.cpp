// Anchor of the precompiled <ATen/ATen.h> that executables linking the runtime reuse
// (CMake's REUSE_FROM needs a target that owns the header); it does nothing else.
int main() { return 0; }
