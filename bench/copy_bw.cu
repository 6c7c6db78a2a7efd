// bench/copy_bw.cu - what sets the bandwidth ceiling (issue 20): device-to-device copies and
// read-only streams on one GPU, timed with CUDA events, median and best of 30 after 5 warm-ups.
// Variants: cudaMemcpyAsync of 2 and 4 GiB with memset data and with random data (the anchors'
// ceilings.py copies random bytes with torch's copy_, 4 GiB), a 16-byte-vector copy kernel, and
// read-only streams (tm_k_read_stream's loop; a plain-load variant). Build and run on the GPU
// machine: nvcc -O3 -arch=sm_90 -o copy_bw bench/copy_bw.cu && ./copy_bw
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static __global__ void rand_fill(uint4 *p, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed ^ (i * 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        uint64_t y = z * 0xd1342543de82ef95ull + 1;
        p[i] = make_uint4((uint32_t)z, (uint32_t)(z >> 32), (uint32_t)y, (uint32_t)(y >> 32));
    }
}

static __global__ void copy_kernel(uint4 *d, const uint4 *s, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        __stcs(d + i, __ldcs(s + i));
}

template <int CS> static __global__ void read_kernel(const uint4 *p, size_t n, float *out) {
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = CS ? __ldcs(p + i) : p[i];
        acc += __uint_as_float(v.x << 16) + __uint_as_float(v.y << 16) +
               __uint_as_float(v.z << 16) + __uint_as_float(v.w << 16);
    }
    if (acc == 1.2345f)
        out[blockIdx.x] = acc;
}

static int cmp(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef void (*op_fn)(void *, void *, size_t, float *, int);
static void op_memcpy(void *d, void *s, size_t n, float *o, int g) {
    (void)o, (void)g;
    cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, 0);
}
static void op_copyk(void *d, void *s, size_t n, float *o, int g) {
    (void)o;
    copy_kernel<<<g, 512>>>((uint4 *)d, (const uint4 *)s, n / 16);
}
static void op_read_cs(void *d, void *s, size_t n, float *o, int g) {
    (void)d;
    read_kernel<1><<<g, 512>>>((const uint4 *)s, n / 16, o);
}
static void op_read(void *d, void *s, size_t n, float *o, int g) {
    (void)d;
    read_kernel<0><<<g, 512>>>((const uint4 *)s, n / 16, o);
}

static void timeit(const char *name, op_fn f, void *d, void *s, size_t n, float *o, int g,
                   double bytes_factor) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float t[30];
    for (int i = -5; i < 30; i++) {
        cudaEventRecord(a, 0);
        f(d, s, n, o, g);
        cudaEventRecord(b, 0);
        cudaEventSynchronize(b);
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        if (i >= 0)
            t[i] = ms;
    }
    qsort(t, 30, sizeof(float), cmp);
    const double gb = bytes_factor * n / 1e9;
    printf("%-34s %5.2f GiB  grid %5d  median %.3f ms %6.0f GB/s  best %6.0f GB/s  (%s)\n", name,
           n / 1073741824.0, g, t[15], gb / (t[15] * 1e-3), gb / (t[0] * 1e-3),
           cudaGetErrorString(cudaGetLastError()));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

int main(void) {
    const size_t n4 = (size_t)4 << 30;
    void *a, *b;
    float *o;
    if (cudaMalloc(&a, n4) || cudaMalloc(&b, n4) || cudaMalloc((void **)&o, 1 << 20)) {
        printf("cudaMalloc failed\n");
        return 1;
    }
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaMemset(a, 1, n4);
    timeit("memcpy memset-data", op_memcpy, b, a, n4 / 2, o, 0, 2);
    timeit("memcpy memset-data", op_memcpy, b, a, n4, o, 0, 2);
    rand_fill<<<sms * 8, 512>>>((uint4 *)a, n4 / 16, 7);
    cudaDeviceSynchronize();
    timeit("memcpy random-data", op_memcpy, b, a, n4 / 2, o, 0, 2);
    timeit("memcpy random-data", op_memcpy, b, a, n4, o, 0, 2);
    for (int k = 2; k <= 16; k *= 2)
        timeit("copy kernel (16 B, streaming)", op_copyk, b, a, n4 / 2, o, sms * k, 2);
    for (int k = 4; k <= 32; k *= 2)
        timeit("read-only __ldcs", op_read_cs, b, a, n4, o, sms * k, 1);
    timeit("read-only plain loads", op_read, b, a, n4, o, sms * 16, 1);
    return 0;
}
