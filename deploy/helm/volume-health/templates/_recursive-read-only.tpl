{{/*
"true" when the agent's read-only mounts of the host's /proc, /sys and /dev
get recursiveReadOnly: IfPossible, "" otherwise (deploy/components/
recursive-read-only says why those three). API servers before 1.30 refuse
the field as unknown; 1.30 accepts it but drops it unless its alpha gate is
on; from 1.31 it is on by default. So `auto` sends it to 1.31 and newer only:
the cluster's version under `helm install`, --kube-version (or helm's own
default, its client's version) under `helm template`.
*/}}
{{- define "volume-health.recursiveReadOnly" -}}
{{- $mode := toString .Values.recursiveReadOnly -}}
{{- if eq $mode "auto" -}}
{{- if semverCompare ">=1.31-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- else if eq $mode "enabled" -}}
true
{{- else if ne $mode "disabled" -}}
{{- fail (printf "recursiveReadOnly must be auto, enabled or disabled, not %q" $mode) -}}
{{- end -}}
{{- end -}}
