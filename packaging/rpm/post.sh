# rpm %post: $1 is 1 on install, 2 on upgrade.
/usr/lib/vgpu/package-hooks installed
