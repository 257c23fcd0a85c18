/* N(0, std²) float32 noise for dpbench's gradient releases: Philox4x32-10 bits (Salmon, Moraes, Dror & Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC 2011) turned into Gaussian pairs by the Box–Muller transform,
 * in loops that compilers vectorize. dpbench/privacy/noise.py says why dpbench has its own sampler.
 *
 * The stream, exactly (tests/test_noise.py transcribes it in NumPy and checks this file against it bit for bit):
 *   block j = counter + k, k = 0, 1, ...:
 *     (w0, w1, w2, w3) = Philox4x32-10(key = (key mod 2³², key div 2³²), ctr = (j mod 2³², j div 2³², 0, 0))
 *     out[4k] = (R(w0)·std)·cos Θ(w1),  out[4k + 1] = (R(w0)·std)·sin Θ(w1),
 *     out[4k + 2] = (R(w2)·std)·cos Θ(w3),  out[4k + 3] = (R(w2)·std)·sin Θ(w3),
 *   R(w) = √(2·(−ln u)) with u = (w + 1)/2³² ∈ (0, 1],   Θ(w) = 2π·w/2³² ∈ [0, 2π),
 *   std rounded to float32 (relative error ≤ 2⁻²⁴, as in PyTorch's float32 sampler).
 * ln, sin and cos are evaluated in float32 by the polynomials below (the coefficients of Cephes' logf, sinf and
 * cosf, S. L. Moshier), in the order written; the build turns off fused multiply-adds (-ffp-contract=off). Every
 * step is an IEEE float32 +, −, ×, √ or an exact conversion, so the numbers do not depend on the instruction set
 * the loops are compiled for. A uniform has 32 bits: |out| ≤ std·√(64 ln 2) = 6.66·std (PyTorch's CPU sampler,
 * with 24-bit uniforms, stops at 5.77·std).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define GROUP 64 /* Philox blocks per pass of the loops; the output does not depend on it */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
    && !defined(DPBENCH_ONE_TARGET) /* benchmarks/noise_time.py builds one instruction set at a time */
/* One copy of fill() per instruction set, chosen when the module loads (GCC's function multi-versioning). */
#define FILL_TARGETS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define INLINE static inline __attribute__((always_inline))
#else
#define FILL_TARGETS
#define INLINE static inline
#endif

INLINE float as_float(uint32_t bits) { float value; memcpy(&value, &bits, 4); return value; }
INLINE uint32_t as_bits(float value) { uint32_t bits; memcpy(&bits, &value, 4); return bits; }

/* Philox4x32-10 of GROUP consecutive counters: w[i][k] is word i of block first + k. */
INLINE void philox_group(uint64_t first, uint32_t key0, uint32_t key1, uint32_t w[4][GROUP]) {
    for (int k = 0; k < GROUP; k++) {
        uint64_t counter = first + (uint64_t)k;
        w[0][k] = (uint32_t)counter; w[1][k] = (uint32_t)(counter >> 32); w[2][k] = 0; w[3][k] = 0;
    }
    for (int round = 0; round < 10; round++) {
        for (int k = 0; k < GROUP; k++) {
            uint64_t p0 = (uint64_t)0xD2511F53u * w[0][k], p1 = (uint64_t)0xCD9E8D57u * w[2][k];
            uint32_t x0 = (uint32_t)(p1 >> 32) ^ w[1][k] ^ key0, x2 = (uint32_t)(p0 >> 32) ^ w[3][k] ^ key1;
            w[1][k] = (uint32_t)p1; w[3][k] = (uint32_t)p0; w[0][k] = x0; w[2][k] = x2;
        }
        key0 += 0x9E3779B9u; key1 += 0xBB67AE85u;
    }
}

/* −ln u for u = (w + 1)/2³²: u = m·2^e with m ∈ [√½, √2), ln u = e·ln 2 + ln m, ln(1 + f) by Cephes' polynomial. */
INLINE float minus_log_uniform(uint32_t w) {
    /* (w + 1) in float32, correctly rounded, from two exact halves; 2⁻³² is an exact scaling */
    float u = ((float)(int32_t)(w >> 16) * 65536.0f + (float)(int32_t)((w & 0xFFFFu) + 1u)) * 0x1p-32f;
    uint32_t bits = as_bits(u);
    int32_t exponent = (int32_t)(bits >> 23) - 126;               /* u = m·2^exponent, m ∈ [½, 1) */
    uint32_t mantissa = (bits & 0x007FFFFFu) | 0x3F000000u;
    uint32_t below = mantissa < 0x3F3504F3u;                      /* m < √½: use 2m, exponent − 1 */
    mantissa += below << 23;
    exponent -= (int32_t)below;
    float f = as_float(mantissa) - 1.0f, z = f * f, e = (float)exponent;
    float p = 0x1.204376p-4f;
    p = p * f - 0x1.d7a370p-4f;
    p = p * f + 0x1.de4a34p-4f;
    p = p * f - 0x1.fcba9ep-4f;
    p = p * f + 0x1.23d37ep-3f;
    p = p * f - 0x1.555ca0p-3f;
    p = p * f + 0x1.999d58p-3f;
    p = p * f - 0x1.fffff8p-3f;
    p = p * f + 0x1.555554p-2f;
    float y = p * f * z;
    y = y - 0x1.bd0106p-13f * e;                                  /* ln 2 = 0x1.63p-1 + 0x1.bd0106p-13 (split) */
    y = y - 0.5f * z;
    float log_u = f + y;
    log_u = log_u + 0x1.63p-1f * e;
    return -log_u;
}

/* cos Θ and sin Θ for Θ = 2π·w/2³²: the top three bits pick the octant, the other 29 the angle within it. */
INLINE void cos_sin_angle(uint32_t w, float *cos_out, float *sin_out) {
    uint32_t octant = w >> 29, low = w & 0x1FFFFFFFu;
    uint32_t odd = 0u - (octant & 1u);                            /* odd octants count the angle down from π/4 */
    uint32_t steps = (low & ~odd) | ((0x20000000u - low) & odd);
    float t = (float)(int32_t)steps * 0x1.921fb6p-30f;            /* ∈ [0, π/4]: steps · (π/4)/2²⁹ */
    float z = t * t;
    float s = ((-0x1.9943f2p-13f * z + 0x1.11073cp-7f) * z - 0x1.555546p-3f) * z * t + t;
    float c = ((0x1.99eb9cp-16f * z - 0x1.6c0c34p-10f) * z + 0x1.55554ap-5f) * z * z - 0.5f * z + 1.0f;
    uint32_t swap = 0u - (((octant + 1u) >> 1) & 1u);             /* octants 1, 2, 5, 6 */
    uint32_t sin_bits = (as_bits(s) & ~swap) | (as_bits(c) & swap);
    uint32_t cos_bits = (as_bits(c) & ~swap) | (as_bits(s) & swap);
    sin_bits ^= (octant & 4u) << 29;                              /* sin < 0 in octants 4–7 */
    cos_bits ^= ((octant + 2u) & 4u) << 29;                       /* cos < 0 in octants 2–5 */
    *cos_out = as_float(cos_bits);
    *sin_out = as_float(sin_bits);
}

INLINE void box_muller_group(uint32_t w[4][GROUP], float std, float *out) {
    for (int k = 0; k < GROUP; k++) {
        float c1, s1, c3, s3;
        float r0 = __builtin_sqrtf(2.0f * minus_log_uniform(w[0][k])) * std;
        float r2 = __builtin_sqrtf(2.0f * minus_log_uniform(w[2][k])) * std;
        cos_sin_angle(w[1][k], &c1, &s1);
        cos_sin_angle(w[3][k], &c3, &s3);
        out[4 * k] = r0 * c1;
        out[4 * k + 1] = r0 * s1;
        out[4 * k + 2] = r2 * c3;
        out[4 * k + 3] = r2 * s3;
    }
}

FILL_TARGETS static void fill(float *out, int64_t n, uint64_t key, uint64_t counter, float std) {
    uint32_t w[4][GROUP];
    float tail[4 * GROUP];
    for (int64_t done = 0; done < n; done += 4 * GROUP) {
        philox_group(counter + (uint64_t)(done / 4), (uint32_t)key, (uint32_t)(key >> 32), w);
        if (n - done >= 4 * GROUP) {
            box_muller_group(w, std, out + done);
        } else {
            box_muller_group(w, std, tail);
            memcpy(out + done, tail, (size_t)(n - done) * sizeof(float));
        }
    }
}

static PyObject *fill_normal(PyObject *module, PyObject *args) {
    PyObject *target;
    unsigned long long key, counter;
    double std;
    if (!PyArg_ParseTuple(args, "OKKd:fill_normal", &target, &key, &counter, &std))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(target, &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    const char *format = view.format;
    if (format[0] == '<' || format[0] == '=' || format[0] == '@')
        format++;
    if (view.itemsize != 4 || strcmp(format, "f") != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "fill_normal needs a writable C-contiguous float32 buffer");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    fill((float *)view.buf, (int64_t)(view.len / 4), (uint64_t)key, (uint64_t)counter, (float)std);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fill_normal", fill_normal, METH_VARARGS,
     "fill_normal(buffer, key, counter, std): fill a writable float32 buffer with std * N(0, 1) numbers from\n"
     "Philox4x32-10 blocks counter, counter + 1, ... under key (four numbers a block; see dpbench/privacy/_philox.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef philox_module = {PyModuleDef_HEAD_INIT, "_philox", NULL, 0, methods};

PyMODINIT_FUNC PyInit__philox(void) { return PyModule_Create(&philox_module); }
