// The DSA backends' and caches' static facts live in the plan layer
// (torch-free): ascend_attn_rt/plan/dsa_backend_facts.h. This header keeps the
// family's include path working.
#pragma once

#include "ascend_attn_rt/plan/dsa_backend_facts.h"
