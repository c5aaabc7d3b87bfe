# rpm %postun: $1 is 0 on erase, 1 on upgrade. rpm removes only the folders a package lists, and cargo
# generate-rpm lists none (its empty-folder assets do not build): vgpu's own folders go here, deepest first,
# each only if empty, as dpkg removes those it created. An edited config.toml stays as config.toml.rpmsave,
# and /etc/vgpu with it.
if [ "$1" -eq 0 ]; then
    for d in /usr/lib/vgpu /usr/share/vgpu/hooks.d /usr/share/vgpu/grafana /usr/share/vgpu/helm/vgpu/templates \
        /usr/share/vgpu/helm/vgpu /usr/share/vgpu/helm /usr/share/vgpu /usr/share/doc/vgpu/engines \
        /usr/share/doc/vgpu/examples /usr/share/doc/vgpu /etc/vgpu; do
        rmdir "$d" 2>/dev/null || true
    done
fi
