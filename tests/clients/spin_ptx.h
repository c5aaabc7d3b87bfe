/* The spin kernel the compute test programs launch (compute_client.c, tests/soak/soak.c): `vgpu_spin(cycles)`
 * spins for `cycles` clock64 ticks on a GPU; the fake driver gives every kernel FAKE_CUDA_KERNEL_US. */
#ifndef VGPU_SPIN_PTX_H
#define VGPU_SPIN_PTX_H
static const char *ptx =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry vgpu_spin(.param .u64 cycles)\n"
    "{\n"
    "\t.reg .pred %p;\n"
    "\t.reg .b64 %rd<5>;\n"
    "\tld.param.u64 %rd1, [cycles];\n"
    "\tmov.u64 %rd2, %clock64;\n"
    "LOOP:\n"
    "\tmov.u64 %rd3, %clock64;\n"
    "\tsub.s64 %rd4, %rd3, %rd2;\n"
    "\tsetp.lt.u64 %p, %rd4, %rd1;\n"
    "\t@%p bra LOOP;\n"
    "\tret;\n"
    "}\n";
#endif
