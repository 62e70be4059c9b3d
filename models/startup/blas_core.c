/* OpenBLAS's kernels for this CPU (docs/environment.md, OPENBLAS_CORETYPE).
 *
 * An OpenBLAS built for every x86 (DYNAMIC_ARCH, as Debian's) picks its kernels when it is
 * loaded, from the CPU's family and model, and falls back to Prescott's SSE3 kernels for a
 * model it does not know: Debian 12's OpenBLAS 0.3.21 does not know the Xeons after Sapphire
 * Rapids (family 6, model 207 here), and its dgemm and sgemm then run at half the speed or
 * less, the FP64 reference with them. The kernels are chosen once, in OpenBLAS's constructor,
 * from OPENBLAS_CORETYPE when it is set; nothing a program does later changes them, and the
 * variable cannot be set for that constructor from inside the process (libc takes its
 * environment back from the kernel's after the program's .preinit_array has run).
 *
 * So this file, compiled into every program that links OpenBLAS (seldp_blas's interface
 * source, executables only), starts the program again when OpenBLAS fell back: a function of
 * the program's .init_array, which runs after every shared library's constructor and before
 * main, finds OpenBLAS on Prescott's kernels on a CPU whose instruction sets have better ones
 * (AVX-512 F/CD/BW/DQ/VL: SkylakeX; AVX2 and FMA: Haswell; the kernels OpenBLAS picks itself
 * for the models it knows), sets OPENBLAS_CORETYPE to them and executes the program again with
 * the same arguments, the same process. It does nothing when the variable is set (OpenBLAS's
 * alone), when OpenBLAS chose other kernels, or under valgrind (a program executed again
 * would leave it). Which kernels ran is in report.json (`blas_core`, tm_blas_core). */
#define _GNU_SOURCE

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "../../src/env.h"

static const char *core_of_this_cpu(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
#endif
    return NULL;
}

static void name_blas_core(int argc, char **argv, char **envp)
{
    (void)envp;
    if (argc < 1 || !argv || seldp__env_present(SELDP__ENV_OPENBLAS_CORETYPE))
        return;
    const char *preload = seldp__env_text(SELDP__ENV_LD_PRELOAD);
    if (preload && strstr(preload, "vgpreload"))
        return; /* valgrind's tools preload vgpreload_*.so */
    const char *mine = openblas_get_corename();
    const char *core = core_of_this_cpu();
    if (!core || !mine || strcmp(mine, "Prescott") != 0)
        return;
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0)
        return;
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE"); /* not executed again: go on with Prescott's kernels */
}

__attribute__((section(".init_array"),
               used)) static void (*const name_blas_core_entry)(int, char **,
                                                                char **) = name_blas_core;
