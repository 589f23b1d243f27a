// See gloo/decls.h: cpp/c_api/cp_gloo.cpp only.
#pragma once
#include "decls.h"
