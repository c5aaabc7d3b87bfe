# rpm %preun: $1 is 0 on erase, 1 on upgrade (where the binaries are replaced, not deleted).
if [ "$1" -eq 0 ]; then /usr/lib/vgpu/package-hooks removing; fi
