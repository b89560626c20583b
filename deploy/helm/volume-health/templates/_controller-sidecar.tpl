{{/*
The controller's sidecar as a strategic-merge patch for the driver's
controller Deployment or StatefulSet: deploy/controller/sidecar.yaml with this release's
image, port, resources and user (tests/tests/server/deploy_controller.rs
renders both and compares them).
*/}}
{{- define "volume-health.controllerSidecar" -}}
spec:
  template:
    spec:
      containers:
        - name: volume-health-controller
          image: {{ .Values.image.repository }}:{{ .Values.image.tag }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          command: ["/usr/local/bin/health-controller"]
          env:
            - name: CSI_ADDRESS
              value: /csi/csi.sock
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            - name: HEALTH_METRICS_ADDR
              value: "0.0.0.0:{{ .Values.controller.metrics.port }}"
          ports:
            - name: health-metrics
              containerPort: {{ .Values.controller.metrics.port }}
              protocol: TCP
          livenessProbe:
            httpGet:
              path: /healthz
              port: health-metrics
            periodSeconds: 10
            timeoutSeconds: 2
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: health-metrics
            periodSeconds: 10
            timeoutSeconds: 2
            failureThreshold: 3
          resources:
            {{- toYaml .Values.controller.resources | nindent 12 }}
          securityContext:
            {{- toYaml .Values.controller.securityContext | nindent 12 }}
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
            seccompProfile:
              type: RuntimeDefault
          volumeMounts:
            - name: {{ .Values.controller.socketVolume }}
              mountPath: /csi
{{- end }}
