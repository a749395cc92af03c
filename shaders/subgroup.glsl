// Subgroup operations over the subgroups a kernel was laid out for. Without SG_LOGICAL they are
// the device's own: each name below is its GL_KHR_shader_subgroup built-in. With SG_LOGICAL (a
// power of two, a multiple of the device's subgroup size; vkrt/ops/reduce.py subgroup_defines: a
// device profile laid out for wider subgroups than the device runs, as the tests run the RX 580's
// 64-lane layouts on lavapipe's 8 lanes) a subgroup is SG_LOGICAL consecutive invocations of
// whole device subgroups: a shuffle within a device subgroup stays one, a wider one goes through
// shared memory, so a butterfly adds the same values in the same order as on a device of
// SG_LOGICAL lanes; the reductions end in shared memory. Emulated operations wait at workgroup
// barriers: call them from the workgroup's uniform control flow. The including shader declares
// its workgroup size WG (a define or a specialisation constant) first.
#ifndef VKRT_SUBGROUP_GLSL
#define VKRT_SUBGROUP_GLSL
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable

// the invocation's place in the workgroup, subgroup by subgroup
#define sg_flat() (gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID)

#ifndef SG_LOGICAL
#define SG_SIZE gl_SubgroupSize
#define sg_id() gl_SubgroupID
#define sg_lane() gl_SubgroupInvocationID
#define sg_count() gl_NumSubgroups
#define sg_elect() subgroupElect()
#define sg_shuffle_xor(v, o) subgroupShuffleXor(v, o)
#define sg_add(v) subgroupAdd(v)
#define sg_max(v) subgroupMax(v)
#define sg_min(v) subgroupMin(v)
#define sg_barrier() subgroupBarrier()
#else
#define SG_SIZE SG_LOGICAL
#define sg_id() (sg_flat() / SG_LOGICAL)
#define sg_lane() (sg_flat() % SG_LOGICAL)
#define sg_count() (WG / SG_LOGICAL)
#define sg_elect() (sg_lane() == 0u)
#define sg_barrier() barrier()

shared float sg_xf[WG];   // each invocation's value, for the lanes outside its device subgroup
shared uint sg_xu[WG];

float sg_shuffle_xor(float v, uint o) {
    if (o < gl_SubgroupSize) {
        return subgroupShuffleXor(v, o);
    }
    sg_xf[sg_flat()] = v;
    barrier();
    v = sg_xf[sg_flat() ^ o];
    barrier();
    return v;
}

// the device subgroups' results r of this subgroup's SG_LOGICAL lanes, combined in their order
#define SG_COMBINE(T, buf, r, op) \
    const T r_ = r; \
    if (subgroupElect()) { \
        buf[gl_SubgroupID] = r_; \
    } \
    barrier(); \
    const uint n_ = SG_LOGICAL / gl_SubgroupSize, first_ = sg_id() * n_; \
    T all_ = buf[first_]; \
    for (uint i_ = 1u; i_ < n_; i_++) { \
        all_ = op; \
    } \
    barrier(); \
    return all_;

float sg_add(float v) {
    SG_COMBINE(float, sg_xf, subgroupAdd(v), all_ + sg_xf[first_ + i_])
}

float sg_max(float v) {
    SG_COMBINE(float, sg_xf, subgroupMax(v), max(all_, sg_xf[first_ + i_]))
}

uint sg_min(uint v) {
    SG_COMBINE(uint, sg_xu, subgroupMin(v), min(all_, sg_xu[first_ + i_]))
}
#endif

#endif
