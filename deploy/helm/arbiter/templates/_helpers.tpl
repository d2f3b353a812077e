{{/*
Names, labels, the image, the secret references and the checks every template shares.
*/}}

{{- define "arbiter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, cut to 63 characters (a DNS label). */}}
{{- define "arbiter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "arbiter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "arbiter.labels" -}}
helm.sh/chart: {{ include "arbiter.chart" . }}
{{ include "arbiter.selectorLabels" . }}
app.kubernetes.io/version: {{ include "arbiter.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: arbiter
{{- end }}

{{- define "arbiter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "arbiter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The server pods: what the Service, the PodDisruptionBudget and the HPA's Deployment select. */}}
{{- define "arbiter.serverSelectorLabels" -}}
{{ include "arbiter.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{- define "arbiter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "arbiter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "arbiter.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "arbiter.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "arbiter.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
The settings that hold a secret, each from a value (into the chart's Secret) or from an existing
Secret: a list of {env, values, required} the Secret and the env blocks both walk.
*/}}
{{- define "arbiter.secretSettings" -}}
- env: ARBITER_DATABASE_URL
  from: database
  value: {{ .Values.database.url | quote }}
- env: ARBITER_REDIS_URL
  from: redis
  value: {{ .Values.redis.url | quote }}
- env: ARBITER_SECRET_KEY
  from: secretKey
  value: {{ .Values.secretKey.value | quote }}
- env: ARBITER_KEY_PEPPER
  from: pepper
  value: {{ .Values.pepper.value | quote }}
- env: ARBITER_BOOTSTRAP_ADMIN_KEY
  from: bootstrapAdminKey
  value: {{ .Values.bootstrapAdminKey.value | quote }}
{{- end }}

{{/*
One env entry with a secretKeyRef: to the existing Secret when one is named, else to the chart's
Secret (the given name) when a value is set; nothing when neither is.
Called with (dict "setting" <one of arbiter.secretSettings> "root" $ "secretName" <name>).
*/}}
{{- define "arbiter.secretEnv" -}}
{{- $existing := (index .root.Values .setting.from).existingSecret }}
{{- if $existing.name }}
- name: {{ .setting.env }}
  valueFrom:
    secretKeyRef:
      name: {{ $existing.name }}
      key: {{ $existing.key }}
{{- else if .setting.value }}
- name: {{ .setting.env }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .setting.env }}
{{- end }}
{{- end }}

{{/*
What the install cannot go on without, each refused with what to set. Schema validation
(values.schema.json) has already checked the types and shapes.
*/}}
{{- define "arbiter.validate" -}}
{{- if not .Values.image.repository }}
{{- fail "image.repository is required: build deploy/Dockerfile's image, push it to your registry and set image.repository (and image.tag, default the chart's appVersion); see docs/deploy.md" }}
{{- end }}
{{- $db := .Values.database }}
{{- if and $db.url $db.existingSecret.name }}
{{- fail "database: set database.url or database.existingSecret.name, not both" }}
{{- end }}
{{- if not (or $db.url $db.existingSecret.name) }}
{{- fail "database is required: set database.url (postgresql://user:...@host:5432/db) or database.existingSecret.name (and .key) to a Secret holding that URL" }}
{{- end }}
{{- if and $db.url (not (regexMatch "^postgres(ql)?://" $db.url)) }}
{{- fail "database.url must be a PostgreSQL URL (postgresql://user:...@host:5432/db): pods share one database, and their root filesystem is read-only" }}
{{- end }}
{{- $redis := .Values.redis }}
{{- if and $redis.url $redis.existingSecret.name }}
{{- fail "redis: set redis.url or redis.existingSecret.name, not both" }}
{{- end }}
{{- if and $redis.url (not (regexMatch "^rediss?://" $redis.url)) }}
{{- fail "redis.url must be a Redis URL (redis://host:6379/0, or rediss:// for TLS)" }}
{{- end }}
{{- range $from := list "secretKey" "pepper" "bootstrapAdminKey" }}
{{- $setting := index $.Values $from }}
{{- if and $setting.value $setting.existingSecret.name }}
{{- fail (printf "%s: set %s.value or %s.existingSecret.name, not both" $from $from $from) }}
{{- end }}
{{- end }}
{{- range $from := list "secretKey" "pepper" }}
{{- $setting := index $.Values $from }}
{{- if not (or $setting.value $setting.existingSecret.name) }}
{{- fail (printf "%s is required: set %s.value (random, 32+ characters: python3 -c 'import secrets; print(secrets.token_urlsafe(32))') or %s.existingSecret.name (and .key)" $from $from $from) }}
{{- end }}
{{- if and $setting.value (lt (len $setting.value) 32) }}
{{- fail (printf "%s.value is too short: it must be at least 32 random characters (python3 -c 'import secrets; print(secrets.token_urlsafe(32))')" $from) }}
{{- end }}
{{- end }}
{{- range $from := list "database" "redis" "secretKey" "pepper" "bootstrapAdminKey" }}
{{- $setting := index $.Values $from }}
{{- if regexMatch "(?i)change[-_ ]?me" (printf "%s" (default $setting.url $setting.value)) }}
{{- fail (printf "%s is still a CHANGE-ME placeholder: set a real value" $from) }}
{{- end }}
{{- end }}
{{- $admin := .Values.bootstrapAdminKey.value }}
{{- if and $admin (or (not (hasPrefix "arb_admin_" $admin)) (lt (len $admin) 30)) }}
{{- fail "bootstrapAdminKey.value must be an admin key: arb_admin_ and random characters, 30 or more in all (python3 -c 'import secrets; print(\"arb_admin_\" + secrets.token_urlsafe(32))')" }}
{{- end }}
{{- range $name, $_ := .Values.config }}
{{- if has $name (include "arbiter.ownSettings" $ | fromYamlArray) }}
{{- fail (printf "config.%s: the chart sets this one itself, or it is a secret, which never goes in the ConfigMap: use its own value (database, redis, secretKey, pepper, bootstrapAdminKey, logLevel, metrics, forwardedAllowIps, usageSpool) or extraEnv with a secretKeyRef" $name) }}
{{- end }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (not (kindIs "invalid" $pdb.minAvailable)) (not (kindIs "invalid" $pdb.maxUnavailable)) }}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both (set the other to null)" }}
{{- end }}
{{- if and $pdb.enabled (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable) }}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas is above autoscaling.maxReplicas" }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.enabled needs at least one entry in ingress.hosts" }}
{{- end }}
{{- if lt (int .Values.terminationGracePeriodSeconds) (add (int .Values.preStopSleepSeconds) 35 | int) }}
{{- fail "terminationGracePeriodSeconds must be at least preStopSleepSeconds + 35 (uvicorn drains for up to 30 s, then the usage writes get 5 s)" }}
{{- end }}
{{- end }}

{{- define "arbiter.spoolClaimName" -}}
{{- default (printf "%s-usage-spool" (include "arbiter.fullname" .)) .Values.usageSpool.persistentVolumeClaim.existingClaim }}
{{- end }}

{{/* Settings the chart sets itself, and every secret one: never in .Values.config (the ConfigMap). */}}
{{- define "arbiter.ownSettings" -}}
- ARBITER_HOST
- ARBITER_PORT
- ARBITER_AUTO_MIGRATE
- ARBITER_LOG_LEVEL
- ARBITER_METRICS_PORT
- ARBITER_METRICS_HOST
- ARBITER_FORWARDED_ALLOW_IPS
- ARBITER_USAGE_SPOOL_DIR
- ARBITER_DATABASE_URL
- ARBITER_REDIS_URL
- ARBITER_SECRET_KEY
- ARBITER_KEY_PEPPER
- ARBITER_BOOTSTRAP_ADMIN_KEY
- ARBITER_METRICS_TOKEN
- ARBITER_MESH_KEY
{{- end }}
