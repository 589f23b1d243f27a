// The DSA attention-KV plan lives in the plan layer (torch-free):
// ascend_attn_rt/plan/dsa_kv_plan.h. This header keeps the family's include
// path working.
#pragma once

#include "ascend_attn_rt/plan/dsa_kv_plan.h"
