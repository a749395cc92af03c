// Shared by every kernel: extensions and helpers.
#ifndef VKRT_COMMON_GLSL
#define VKRT_COMMON_GLSL

#extension GL_EXT_control_flow_attributes : enable

// Flat invocation index over a 2-D grid of workgroups (x fastest); large 1-D launches are
// split into rows of at most 65535 workgroups. A macro, not a function: gl_WorkGroupSize
// must be read after the shader's local_size layout, which may follow this include.
#define global_index() \
    ((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x)

#endif
