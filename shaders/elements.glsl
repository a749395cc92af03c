// Raw 16- and 32-bit elements in storage buffers, and fp32 conversions between element types.
//
// Element types are GGML type ids (TYPE_*). A buffer of `bits`-wide elements is declared as
// `RAW_T(bits) name[]` with `WRITEONLY(bits)` on destinations, and accessed with
// LOAD(bits, name, i) -> uint (the element's bit pattern) and STORE(bits, name, i, v).
// With STORAGE16 = 1 (the device has 16-bit storage) 16-bit elements are uint16_t; otherwise
// they are halves of uint words: loads shift, stores update their half with two atomics so
// that neighbouring invocations writing the other half cannot race. No 16-bit arithmetic
// is used anywhere: conversions go through fp32 (GCN has no fp16 math).
#ifndef VKRT_ELEMENTS_GLSL
#define VKRT_ELEMENTS_GLSL

#define TYPE_F32 0
#define TYPE_F16 1
#define TYPE_I32 26
#define TYPE_BF16 30

#if STORAGE16
#extension GL_EXT_shader_16bit_storage : require
#define RAW_T16 uint16_t
#define WRITEONLY16 writeonly
#define LOAD16(a, i) uint(a[i])
#define STORE16(a, i, v) a[i] = uint16_t(v)
#else
#define RAW_T16 uint
#define WRITEONLY16
#define LOAD16(a, i) ((a[(i) >> 1u] >> (((i) & 1u) << 4u)) & 0xFFFFu)
#define STORE16(a, i, v) {                                              \
        const uint word_ = (i) >> 1u, shift_ = ((i) & 1u) << 4u;        \
        atomicAnd(a[word_], ~(0xFFFFu << shift_));                      \
        atomicOr(a[word_], ((v) & 0xFFFFu) << shift_);                  \
    }
#endif

#define RAW_T32 uint
#define WRITEONLY32 writeonly
#define LOAD32(a, i) a[i]
#define STORE32(a, i, v) a[i] = (v)

#define RAW_T(bits) RAW_T_(bits)
#define RAW_T_(bits) RAW_T##bits
#define WRITEONLY(bits) WRITEONLY_(bits)
#define WRITEONLY_(bits) WRITEONLY##bits
#define LOAD(bits, a, i) LOAD_(bits, a, i)
#define LOAD_(bits, a, i) LOAD##bits(a, i)
#define STORE(bits, a, i, v) STORE_(bits, a, i, v)
#define STORE_(bits, a, i, v) STORE##bits(a, i, v)

// bit pattern of type `from` -> fp32 -> bit pattern of type `to` (float types only)
float to_f32_0(uint b) { return uintBitsToFloat(b); }
float to_f32_1(uint b) { return unpackHalf2x16(b).x; }
float to_f32_30(uint b) { return uintBitsToFloat(b << 16u); }
uint from_f32_0(float f) { return floatBitsToUint(f); }
uint from_f32_1(float f) { return packHalf2x16(vec2(f, 0.0)) & 0xFFFFu; }

#define CONVERT(from, to, b) CONVERT_(from, to, b)
#define CONVERT_(from, to, b) from_f32_##to(to_f32_##from(b))

#endif
