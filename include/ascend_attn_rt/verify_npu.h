// verify-npu: every operator call the runtime makes, with the backends' argument
// combinations, run through torch_npu on the NPU and through its CPU twin on copies
// of the inputs, compared against each row's tolerance. run_verify_cli serves the
// aar_verify_npu executable and `python -m ascend_attn_rt verify-npu`: --stand-in
// twin | perturbed:OP, --only SUBSTRING, --list; exit 0 pass, 1 a row failed,
// 2 no NPU. Rows and the assumptions they settle: docs/design/ops.md §8.
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
