// verify-npu (issue 14 part 5): every operator call the runtime makes, with
// the argument combinations the backends use, run once through torch_npu
// (provider npu, on the NPU) and once through the CPU twin on copies of the
// same inputs; a table of max errors per call with pass/fail against each
// row's stated tolerance, and the open assumption each row settles.
//
// One table (cpp/common/verify_npu.cpp) serves both front ends: the C++
// executable `aar_verify_npu` and `python -m ascend_attn_rt verify-npu` call
// run_verify_cli with their argument lists.
//
// Options: --stand-in twin        the CPU twin stands in for the NPU (every row
//                                 must pass: a self-check of the harness)
//          --stand-in perturbed:OP the twin stands in, and the stand-in's
//                                 output of operator OP (e.g.
//                                 npu_fused_infer_attention_score) is perturbed:
//                                 its rows must fail, naming OP and arguments
//          --only SUBSTRING       rows whose operator or arguments contain it
//          --list                 print the rows without running them
// Without an NPU (no PrivateUse1 device: torch_npu not loaded, or no device)
// and without --stand-in, it refuses with exit code 2. Exit code 1: a row
// failed; 0: every row passed.
#pragma once

#include <string>
#include <vector>

namespace aar::verify {

struct Row {
  std::string op;          // operator name (torch_npu / vllm-ascend schema name)
  std::string args;        // the argument combination
  std::string assumption;  // the open assumption the row settles
  double max_err = 0, tol = 0;
  bool pass = false;
  std::string error;  // an exception on either side
};

// Rows as a table, one line per row, then a summary line.
std::string format_table(const std::vector<Row>& rows);
// True when a PrivateUse1 (NPU) device is present.
bool npu_available();
// The CLI: returns the exit code, writes the report to `out`.
int run_verify_cli(const std::vector<std::string>& args, std::string& out);

}  // namespace aar::verify
