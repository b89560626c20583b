{{/*
The apiVersion of the agents' FlowSchema and PriorityLevelConfiguration
(deploy/components/flow-control), "" for none: v1 where the cluster serves
it (Kubernetes 1.29+), else v1beta3 where served (1.26 to 1.31), else none.
Both the API list and the version are asked: under `helm install` they agree
with the cluster; under `helm template` the API list is helm's own (it names
every version helm knows, whatever --kube-version says), so --kube-version
decides there.
*/}}
{{- define "volume-health.flowControlApiVersion" -}}
{{- $v1 := "flowcontrol.apiserver.k8s.io/v1" -}}
{{- $v1beta3 := "flowcontrol.apiserver.k8s.io/v1beta3" -}}
{{- $version := .Capabilities.KubeVersion.Version -}}
{{- if not .Values.priorityAndFairness.enabled -}}
{{- else if and (.Capabilities.APIVersions.Has $v1) (semverCompare ">=1.29-0" $version) -}}
{{ $v1 }}
{{- else if and (.Capabilities.APIVersions.Has $v1beta3) (semverCompare "<1.32-0" $version) -}}
{{ $v1beta3 }}
{{- end -}}
{{- end -}}
