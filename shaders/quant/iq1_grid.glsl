// IQ1_S and IQ1_M: grid entry gi's elements 4h .. 4h + 3 (-1, 0 or 1) plus delta, as gguf's
// grid + delta (exact)
vec4 iq1_grid4(uint gi, uint h, float delta) {
    return (u8f(field4(QGRID(gi), 4u * h, 0xFu)) - 1.0) + delta;
}
