{{/*
The CSI proxy's sidecar as a strategic-merge patch for a CSI driver's node
DaemonSet: deploy/components/csi-proxy/node-plugin.yaml with this release's
image and socket directory (tests/tests/server/deploy_csi_proxy.rs renders both and
compares them).
*/}}
{{- define "volume-health.csiProxySidecar" -}}
spec:
  template:
    spec:
      containers:
        - name: volume-health-csi-proxy
          image: {{ .Values.image.repository }}:{{ .Values.image.tag }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          args: ["csi-proxy"]
          env:
            - name: CSI_ADDRESS
              value: /csi/csi.sock
            - name: CSI_PROXY_ADDRESS
              value: /csi/volume-health/csi.sock
            - name: HEALTH_VOLUME_HEALTH_SOCKET
              value: {{ .Values.csiProxy.socketDir }}/conditions.sock
          resources:
            requests:
              cpu: 5m
              memory: 16Mi
            limits:
              memory: 64Mi
          securityContext:
            runAsNonRoot: false
            runAsUser: 0
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
            seccompProfile:
              type: RuntimeDefault
          volumeMounts:
            - name: socket-dir
              mountPath: /csi
            - name: volume-health-run
              mountPath: {{ .Values.csiProxy.socketDir }}
              readOnly: true
      volumes:
        - name: volume-health-run
          hostPath:
            path: {{ .Values.csiProxy.socketDir }}
            type: DirectoryOrCreate
{{- end }}
