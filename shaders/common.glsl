// Shared by every kernel: extensions and helpers.
#ifndef VKRT_COMMON_GLSL
#define VKRT_COMMON_GLSL

#extension GL_EXT_control_flow_attributes : enable

// Kernels whose outputs must equal gguf's bit for bit (MXFP4's smallest scales are fp32
// subnormals) keep subnormals where the device can (SPIR-V DenormPreserve, width 32).
#ifdef DENORM_PRESERVE
#extension GL_EXT_spirv_intrinsics : require
spirv_execution_mode(extensions = ["SPV_KHR_float_controls"], capabilities = [4464], 4459, 32);
#endif

// Flat invocation index over a 2-D grid of workgroups (x fastest); large 1-D launches are
// split into rows of at most 65535 workgroups. A macro, not a function: gl_WorkGroupSize
// must be read after the shader's local_size layout, which may follow this include.
#define global_index() \
    ((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x)

#endif
