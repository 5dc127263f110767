// The CPU build's stand-in for CUDA's header: the types and conversions live in the emulation layer.
#pragma once
#include "lmplex_cuda_cpu.h"
