{{- define "vgpu.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
{{- define "vgpu.labels" -}}
{{ include "vgpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
{{- define "vgpu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- define "vgpu.installerEnv" -}}
- name: VGPU_ENGINE
  value: {{ .Values.engine | quote }}
- name: VGPU_ENGINE_CONFIG
  value: {{ .Values.engineConfig | quote }}
- name: VGPU_SET_AS_DEFAULT
  value: {{ .Values.setAsDefault | quote }}
- name: VGPU_RESTART
  value: {{ .Values.restart | quote }}
- name: VGPU_NVIDIA_RUNTIME
  value: {{ .Values.nvidiaRuntime | quote }}
- name: VGPU_DEFAULT_MEMORY_LIMIT
  value: {{ .Values.quota.default | quote }}
- name: VGPU_REQUIRE_MEMORY_LIMIT
  value: {{ .Values.quota.required | quote }}
{{- end }}
{{- define "vgpu.podPlacement" -}}
nodeSelector:
  {{- toYaml .Values.nodeSelector | nindent 2 }}
{{ include "vgpu.podScheduling" . }}
{{- end }}
{{- define "vgpu.podScheduling" -}}
tolerations:
  {{- toYaml .Values.tolerations | nindent 2 }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- define "vgpu.nodeConfig" -}}
# Written by the vgpu installer DaemonSet from the chart's ConfigMap {{ .Release.Name }}-node-config: rewritten at
# each install and helm upgrade, removed by its uninstall. lower_runtime is the node's, found by the installer.
hook_path = "/usr/local/bin/vgpu-hook"
library = "/usr/lib/vgpu/libvgpu.so"
{{- with .Values.quota.default }}
default_memory_limit = {{ . | quote }}
{{- end }}
{{- if .Values.quota.required }}
require_memory_limit = true
{{- end }}
{{- with .Values.monitor.hami.containersDir }}
[monitor]
hami_containers_dir = {{ . | quote }}
{{- if $.Values.monitor.hami.taskDir }}
hami_task_dir = {{ $.Values.monitor.hami.taskDir | quote }}
{{- else }}
hami_task_dir = false
{{- end }}
{{- end }}
{{- end }}
