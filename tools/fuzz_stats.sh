#!/usr/bin/env bash
# fuzz_stats.sh TARGET LOG: one summary line from a libFuzzer run's log (-print_final_stats=1):
# inputs executed, inputs/s, edge coverage (cov) and features (ft) at the end of the run.
set -euo pipefail
t=$1 log=$2
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1)
cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
printf '%-20s runs %10s  inputs/s %7s  cov %5s  ft %6s\n' "$t" "$runs" "$rate" "$cov" "$ft"
