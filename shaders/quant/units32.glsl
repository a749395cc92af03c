// The mat-vec units of a type whose block is one 32-element run (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL, MXFP4): 4 units a block, unit u its chunks u and u + 4, so 4 lanes read 16 bytes of a
// block and x in two runs of 16 floats (quant/types.glsl).
#define QU 4
#define QU_R 1
#define QU_C 2
uint qu_run(uint u, uint i) { return 0u; }
uint qu_ch(uint u, uint c) { return u + 4u * c; }
