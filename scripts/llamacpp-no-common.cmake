# Included right after llama.cpp's project() call (CMAKE_PROJECT_llama.cpp_INCLUDE, see
# scripts/setup_llamacpp.sh): llama-cpp-python forces llama.cpp's "common" helper library on, but its
# Python bindings never load it; turning it off here skips compiling it.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
