# llama-cpp-python's build as RAIM makes it (scripts/setup.sh; src/judges/backends/llama_build.py names it in the
# rebuild it asks for when a build cannot run): CMAKE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_INCLUDE=<this file>".
# Only the libraries llama-cpp-python loads are built: llama.cpp's `common` helpers (with cpp-httplib) are never
# loaded by RAIM and were 60 % of the compile; `common` is forced ON by llama-cpp-python's CMakeLists, so a normal
# variable set right after project() shadows that cache entry.
# AMX tiles: inside some VMs the CPU reports AMX and the kernel grants the tile permission, yet the first tile
# instruction traps (SIGILL in ggml's AMX matmul, measured). The AMX path only speeds quantised matmuls on Sapphire
# Rapids and later, so the native build leaves it out.
set(LLAMA_BUILD_COMMON OFF)
include(CheckCCompilerFlag)
check_c_compiler_flag(-mno-amx-tile RAIM_NO_AMX)
if(RAIM_NO_AMX)
  string(APPEND CMAKE_C_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  string(APPEND CMAKE_CXX_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
endif()
