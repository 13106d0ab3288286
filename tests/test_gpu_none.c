// test_gpu_none.c: a build without the CUDA toolkit (make CUDA=/nowhere) compiles none of the GPU engine's test files;
// this one, compiled only there, stands in for them with a skipped test naming them, so the summary counts them.
#include <criterion/criterion.h>

#ifndef DJ_GPU_TESTS
#error "the Makefile names the GPU engine's test files in DJ_GPU_TESTS"
#endif

Test(gpu_none, gpu_suites_not_built) {
    cr_skip_test("built without the CUDA toolkit (DJINN_NO_GPU): %s not compiled (they test the GPU engine)",
                 DJ_GPU_TESTS);
}
