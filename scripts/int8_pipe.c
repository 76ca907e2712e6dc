/* What this core's pipes allow the AVX2 prompt kernel (flexlamps/kernels/tile_gemm.h, `pass2`): its
 * instruction mix in asm loops on data in L1, with no loop, memory or call costs, cut at each stage.
 *
 *     cc -O2 -mavx2 -mfma [-mavxvnni] -o /tmp/int8_pipe scripts/int8_pipe.c && /tmp/int8_pipe
 *
 * A "group" is the kernel's unit: 2 rows of x by 32 output rows by 32 inputs (2048 multiply-adds,
 * 4096 FLOP): 8 steps of 4 code loads, 2 broadcasts of x, 8 vpmaddubsw and 8 vpaddw (int16 sums),
 * then per row and 8 outputs the sums widened to int32 (vpmaddwd with ones) and the fp32 steps that
 * give a row its bits (vcvtdq2ps, a multiply by x's scale, an FMA by the weight's scale, an FMA of
 * the offset by x's sum). Two other roundings are timed for comparison: Q4_0's offset folded into
 * the integers (one FMA less), and Q4_K's integer sub-scales (llama.cpp's Q4_K x Q8_K: vpmaddwd by
 * the 6-bit sub-scale widens, 8 groups summed in int32, the fp32 steps once per 256 inputs, which
 * needs x rounded with one scale per 256). Built with -mavxvnni it also times the AVX-VNNI variant's mix
 * (vpdpbusd, then the same fp32 steps: an Intel desktop core's, 12th gen on). Prints, per mix: ns and cycles a group, GFLOP/s. The
 * clock is a chain of dependent imuls (3 cycles each); times are this thread's CPU time. */
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint8_t codes[1024] __attribute__((aligned(32)));
static int8_t xq[64] __attribute__((aligned(32)));
static float out[64] __attribute__((aligned(32))), scales[128] __attribute__((aligned(32))), xs[4] = {1, 1, 1, 1};
static int32_t sums[64] __attribute__((aligned(32)));
static int16_t ones[16] __attribute__((aligned(32))) = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

/* One step: rows' codes k..k+3 by the sub-tile's 4 vectors of codes, as tile_gemm.h's step_rows. */
#define STEP(k) "vmovdqu " #k "*128(%[w]), %%ymm10\n\tvmovdqu " #k "*128+32(%[w]), %%ymm11\n\t" \
    "vmovdqu " #k "*128+64(%[w]), %%ymm12\n\tvmovdqu " #k "*128+96(%[w]), %%ymm13\n\t" \
    "vpbroadcastd " #k "*4(%[x]), %%ymm14\n\t" \
    "vpmaddubsw %%ymm14, %%ymm10, %%ymm15\n\t" ADD("0") "vpmaddubsw %%ymm14, %%ymm11, %%ymm15\n\t" ADD("1") \
    "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t" ADD("2") "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t" ADD("3") \
    "vpbroadcastd " #k "*4+32(%[x]), %%ymm14\n\t" \
    "vpmaddubsw %%ymm14, %%ymm10, %%ymm15\n\t" ADD("4") "vpmaddubsw %%ymm14, %%ymm11, %%ymm15\n\t" ADD("5") \
    "vpmaddubsw %%ymm14, %%ymm12, %%ymm15\n\t" ADD("6") "vpmaddubsw %%ymm14, %%ymm13, %%ymm15\n\t" ADD("7")
#define STEPS STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7)
/* The same step on AVX-VNNI (tile_gemm_vnni.h): vpdpbusd multiplies 4 code bytes by 4 of x's and adds them
 * to an int32 lane, so the int16 sums (vpaddw) and the widening go; still 32 multiply-adds an instruction. */
#define DP(v, r) "%{vex%} vpdpbusd %%ymm14, %%ymm" v ", %%ymm" r "\n\t"
#define VSTEP(k) "vmovdqu " #k "*128(%[w]), %%ymm10\n\tvmovdqu " #k "*128+32(%[w]), %%ymm11\n\t" \
    "vmovdqu " #k "*128+64(%[w]), %%ymm12\n\tvmovdqu " #k "*128+96(%[w]), %%ymm13\n\t" \
    "vpbroadcastd " #k "*4(%[x]), %%ymm14\n\t" DP("10", "0") DP("11", "1") DP("12", "2") DP("13", "3") \
    "vpbroadcastd " #k "*4+32(%[x]), %%ymm14\n\t" DP("10", "4") DP("11", "5") DP("12", "6") DP("13", "7")
#define VSTEPS VSTEP(0) VSTEP(1) VSTEP(2) VSTEP(3) VSTEP(4) VSTEP(5) VSTEP(6) VSTEP(7)
#define EACH(m) m("0", "0") m("1", "32") m("2", "64") m("3", "96") m("4", "128") m("5", "160") m("6", "192") \
    m("7", "224")
#define WIDEN(r, o) "vpmaddwd %[ones], %%ymm" r ", %%ymm" r "\n\t"
/* tot = fma(offset, sx, fma(scale, cvt(dot) * dx, tot)): the kernel's fp32 steps */
#define FP(r, o) "vcvtdq2ps %%ymm" r ", %%ymm8\n\tvmulps %%ymm9, %%ymm8, %%ymm8\n\tvmovaps " o "(%[out]), %%ymm15\n\t" \
    "vfmadd231ps " o "(%[scales]), %%ymm8, %%ymm15\n\tvfmadd231ps " o "+256(%[scales]), %%ymm9, %%ymm15\n\t" \
    "vmovaps %%ymm15, " o "(%[out])\n\t"
/* Q4_0 with the offset folded: dot - 8 * x's code sum in int32, then tot = fma(scale, cvt(dot) * dx, tot) */
#define FOLD(r, o) "vpsubd %[ones], %%ymm" r ", %%ymm" r "\n\tvcvtdq2ps %%ymm" r ", %%ymm8\n\t" \
    "vmulps %%ymm9, %%ymm8, %%ymm8\n\tvmovaps " o "(%[out]), %%ymm15\n\t" \
    "vfmadd231ps " o "(%[scales]), %%ymm8, %%ymm15\n\tvmovaps %%ymm15, " o "(%[out])\n\t"
/* Q4_K's sub-scale: the int16 sums times the group's 6-bit scale into the int32 sums (memory) */
#define SUBSCALE(r, o) "vpmaddwd %[ones], %%ymm" r ", %%ymm" r "\n\tvpaddd " o "(%[sums]), %%ymm" r ", %%ymm" r "\n\t" \
    "vmovdqa %%ymm" r ", " o "(%[sums])\n\t"
#define FP_ALL "vbroadcastss (%[xs]), %%ymm9\n\t" EACH(FP)
#define FOLD_ALL "vbroadcastss (%[xs]), %%ymm9\n\t" EACH(FOLD)
#define SUB_GROUP STEPS EACH(SUBSCALE)
#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", \
    "xmm12", "xmm13", "xmm14", "xmm15", "memory"
#define OPERANDS : : [w] "r"(codes), [x] "r"(xq), [ones] "m"(ones), [out] "r"(out), [scales] "r"(scales), \
    [xs] "r"(xs), [sums] "r"(sums) : CLOBBERS

#define LOOPS 4000000L
/* `body` (`groups` groups) LOOPS times: ns and cycles a group, GFLOP/s. */
#define TIMED(label, groups, body) do {                                          \
        double t = now();                                                        \
        for (long i = 0; i < LOOPS; i++) __asm__ volatile(body OPERANDS);        \
        double ns = (now() - t) * 1e9 / (LOOPS * (groups));                      \
        printf("%-58s %7.2f ns %6.1f cycles %5.1f GFLOP/s\n", label, ns, ns * ghz, 4096 / ns); \
    } while (0)

int main(void) {
    uint64_t a = 1;
    double t = now();
    /* (not adds: a Golden Cove-class core folds a chain of immediate adds at rename, several a cycle) */
    for (long i = 0; i < 50000000L; i++) __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(a));
    const double ghz = 3 * 4 * 50000000.0 / (now() - t) / 1e9;
    printf("clock %.2f GHz (dependent imuls, 3 cycles each); a group: 2 rows x 32 outputs x 32 inputs, 4096 FLOP\n", ghz);
#define ADD(r) ""
    TIMED("vpmaddubsw alone (64 a group)", 1, STEPS);
#undef ADD
#define ADD(r) "vpaddw %%ymm15, %%ymm" r ", %%ymm" r "\n\t"
    TIMED("+ vpaddw (the int16 sums)", 1, STEPS);
    TIMED("+ widening (vpmaddwd by ones)", 1, STEPS EACH(WIDEN));
    TIMED("+ fp32 steps: the kernel's mix (cvt, mul, 2 FMAs)", 1, STEPS EACH(WIDEN) FP_ALL);
    TIMED("Q4_0 offset folded in int32 (cvt, mul, 1 FMA)", 1, STEPS EACH(WIDEN) FOLD_ALL);
    TIMED("Q4_K integer sub-scales, fp32 steps once per 8 groups", 8,
          SUB_GROUP SUB_GROUP SUB_GROUP SUB_GROUP SUB_GROUP SUB_GROUP SUB_GROUP SUB_GROUP FP_ALL);
#ifdef __AVXVNNI__
    TIMED("AVX-VNNI: vpdpbusd alone (64 a group)", 1, VSTEPS);
    TIMED("AVX-VNNI + fp32 steps: the avx_vnni kernel's mix", 1, VSTEPS FP_ALL);
#endif
    return 0;
}
