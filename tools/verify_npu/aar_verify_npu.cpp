// aar_verify_npu: the C++ front end of verify-npu (ascend_attn_rt/verify_npu.h;
// `python -m ascend_attn_rt verify-npu` is the other, over the same table).
// Exit codes: 0 every row passed, 1 a row failed, 2 refused (no NPU, bad option).
#include <cstdio>
#include <string>
#include <vector>

#include "ascend_attn_rt/verify_npu.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string out;
  const int rc = aar::verify::run_verify_cli(args, out);
  std::fputs(out.c_str(), rc == 2 ? stderr : stdout);
  return rc;
}
