package helm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func TestLintStrict(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
	}{
		{"default", minimalValues()},
		{"production", readValues(t, "ci/production-values.yaml")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = namespace
			res := lint.Run([]string{chartDir}, tc.vals)
			for _, m := range res.Messages {
				t.Logf("lint: %s", m)
			}
			if len(res.Errors) > 0 || res.TotalChartsLinted != 1 {
				t.Fatalf("helm lint --strict: %d charts, errors %v", res.TotalChartsLinted, res.Errors)
			}
		})
	}
}

func TestRenderDefault(t *testing.T) {
	manifest, err := render(t, minimalValues())
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r := decodeAll(t, manifest)
	checkRelease(t, r, 1)
	if len(r.hpas) != 0 || len(r.netpols) != 0 {
		t.Errorf("default values render an HPA %v or a NetworkPolicy %v", keys(r.hpas), keys(r.netpols))
	}
	for _, name := range []string{"prod-ursula-coldgc", "prod-ursula-backup"} {
		if _, ok := r.deployments[name]; ok {
			t.Errorf("default values render %s", name)
		}
	}
	gw := r.deployments["prod-ursula-gateway"]
	if gw.Spec.Replicas == nil || *gw.Spec.Replicas != 2 {
		t.Errorf("gateway replicas %v, want 2", gw.Spec.Replicas)
	}
	// The default admin token Secret is created by the chart.
	tok := r.secrets["prod-ursula-admin-token"]
	if tok == nil || len(tok.Data["token"]) < 32 {
		t.Errorf("admin token Secret %v: want a token of at least 32 bytes", tok)
	}
}

func TestRenderProduction(t *testing.T) {
	manifest, err := render(t, readValues(t, "ci/production-values.yaml"))
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r := decodeAll(t, manifest)
	checkRelease(t, r, 5)

	sts := r.statefulSets["prod-ursula-node"]
	if sts.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("updateStrategy %q, want OnDelete", sts.Spec.UpdateStrategy.Type)
	}
	if a := sts.Spec.Template.Spec.Affinity.PodAntiAffinity; len(a.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Errorf("antiAffinity hard: required terms %v", a.RequiredDuringSchedulingIgnoredDuringExecution)
	}
	if got := sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String(); got != "200Gi" {
		t.Errorf("volume size %s, want 200Gi", got)
	}
	if mem := sts.Spec.Template.Spec.Containers[0].Resources.Limits.Memory().String(); mem != "8Gi" {
		t.Errorf("node memory limit %s, want 8Gi", mem)
	}

	// S3 credentials from the Secret, for every role that reaches the bucket.
	for _, spec := range []*corev1.PodSpec{&sts.Spec.Template.Spec, &r.deployments["prod-ursula-coldgc"].Spec.Template.Spec, &r.deployments["prod-ursula-backup"].Spec.Template.Spec} {
		var refs []string
		for _, e := range spec.Containers[0].Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == "ursula-s3-credentials" {
				refs = append(refs, e.Name)
			}
		}
		if !slices.Equal(refs, []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}) {
			t.Errorf("container %s: S3 credential env %v", spec.Containers[0].Name, refs)
		}
	}

	// The backup service reaches the bucket with the SDK's settings.
	var region string
	for _, e := range r.deployments["prod-ursula-backup"].Spec.Template.Spec.Containers[0].Env {
		if e.Name == "AWS_REGION" {
			region = e.Value
		}
	}
	if region != "eu-west-1" {
		t.Errorf("backup AWS_REGION %q, want eu-west-1 (storage.cold.s3.region)", region)
	}

	// The NetworkPolicy: the cluster plane from voters only; the client
	// plane from every workload of the release.
	np := r.netpols["prod-ursula-node"]
	if np == nil {
		t.Fatalf("no NetworkPolicy (have %v)", keys(r.netpols))
	}
	if sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil || !sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Errorf("NetworkPolicy selects %v, not the voters", np.Spec.PodSelector)
	}
	allowed := func(port int, podLabels map[string]string) bool {
		for _, rule := range np.Spec.Ingress {
			if !slices.ContainsFunc(rule.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.IntValue() == port }) {
				continue
			}
			if len(rule.From) == 0 {
				return true
			}
			for _, from := range rule.From {
				if sel, err := metav1.LabelSelectorAsSelector(from.PodSelector); err == nil && from.PodSelector != nil && sel.Matches(labels.Set(podLabels)) {
					return true
				}
			}
		}
		return false
	}
	voter, gateway := sts.Spec.Template.Labels, r.deployments["prod-ursula-gateway"].Spec.Template.Labels
	for _, c := range []struct {
		who    string
		port   int
		labels map[string]string
		want   bool
	}{
		{"a voter on the cluster plane", 4439, voter, true},
		{"a gateway on the cluster plane", 4439, gateway, false},
		{"a gateway on the client plane", 4437, gateway, true},
		{"the cold-GC worker on the client plane", 4437, r.deployments["prod-ursula-coldgc"].Spec.Template.Labels, true},
		{"the backup service on the client plane", 4437, r.deployments["prod-ursula-backup"].Spec.Template.Labels, true},
		{"the helm test pod on the client plane", 4437, r.pods["prod-ursula-test"].Labels, true},
		{"another pod on the client plane", 4437, map[string]string{"app": "other"}, false},
		{"anyone on the metrics plane", 4440, map[string]string{"app": "other"}, true},
		{"a voter on the admin port", 4438, voter, false},
	} {
		if got := allowed(c.port, c.labels); got != c.want {
			t.Errorf("NetworkPolicy: %s allowed = %v, want %v", c.who, got, c.want)
		}
	}

	hpa := r.hpas["prod-ursula-gateway"]
	if hpa == nil {
		t.Fatal("no gateway HPA")
	}
	if hpa.Spec.ScaleTargetRef.Name != "prod-ursula-gateway" || hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.MaxReplicas != 12 || *hpa.Spec.MinReplicas != 3 {
		t.Errorf("HPA %+v", hpa.Spec)
	}
	if r.deployments["prod-ursula-gateway"].Spec.Replicas != nil {
		t.Error("an autoscaled gateway Deployment sets replicas (the HPA owns them)")
	}

	node := parseTOML(t, r.configMaps["prod-ursula-config"].Data["node.toml"])
	if got := dig(node, "runtime", "node_memory_abort_cap_size"); got != int64(7<<30) {
		t.Errorf("runtime.node_memory_abort_cap_size %v, want the production values' 7 GiB", got)
	}
	if got := dig(node, "raft", "wal", "fsync"); got != "always" {
		t.Errorf("raft.wal.fsync %v, want always (raft.walFsync)", got)
	}
	if got := dig(node, "storage", "cold", "s3", "bucket"); got != "acme-ursula-prod" {
		t.Errorf("storage.cold.s3.bucket %v", got)
	}
	if got := dig(node, "storage", "cold", "root"); got != "ursula-prod" {
		t.Errorf("storage.cold.root %v", got)
	}
	if got := dig(node, "server", "metrics_listen"); got != "0.0.0.0:4440" {
		t.Errorf("server.metrics_listen %v", got)
	}
	if a := sts.Spec.Template.Annotations; a["prometheus.io/port"] != "4440" || a["prometheus.io/path"] != "/__ursula/prometheus" {
		t.Errorf("voter scrape annotations %v", a)
	}
	// The cold-GC worker's only listener is its metrics plane: scraped,
	// and its readiness probe.
	coldgc := parseTOML(t, r.configMaps["prod-ursula-config"].Data["coldgc.toml"])
	if got := dig(coldgc, "server", "metrics_listen"); got != "0.0.0.0:4440" {
		t.Errorf("coldgc server.metrics_listen %v", got)
	}
	cgc := r.deployments["prod-ursula-coldgc"].Spec.Template
	if a := cgc.Annotations; a["prometheus.io/port"] != "4440" || a["prometheus.io/path"] != "/__ursula/prometheus" {
		t.Errorf("cold-GC worker scrape annotations %v", a)
	}
	if p := cgc.Spec.Containers[0].ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/__ursula/ready" ||
		containerPort(cgc.Spec.Containers[0], p.HTTPGet.Port.String()) != 4440 {
		t.Errorf("cold-GC worker readiness probe %+v: want GET /__ursula/ready on the metrics port 4440", p)
	}
	gw := parseTOML(t, r.configMaps["prod-ursula-config"].Data["gateway.toml"])
	if got := dig(gw, "gateway", "max_body_bytes"); got != int64(16777216) {
		t.Errorf("gateway.max_body_bytes %v (%T), want 16777216", got, got)
	}
	backup := parseTOML(t, r.configMaps["prod-ursula-config"].Data["backup.toml"])
	if dig(backup, "backup", "cron") != "0 3 * * *" || dig(backup, "backup", "location") != "s3://acme-ursula-backups/prod-eu-1" || dig(backup, "backup", "keep_last") != int64(14) {
		t.Errorf("backup section %v", backup["backup"])
	}
	// Each role reads its own TLS Secret.
	for deploy, secret := range map[string]string{"prod-ursula-gateway": "ursula-prod-gateway", "prod-ursula-coldgc": "ursula-prod-coldgc", "prod-ursula-backup": "ursula-prod-backup"} {
		if got := secretVolumes(&r.deployments[deploy].Spec.Template.Spec); !slices.Equal(got, []string{secret}) {
			t.Errorf("%s mounts Secrets %v, want [%s]", deploy, got, secret)
		}
	}
	if _, ok := r.secrets["prod-ursula-admin-token"]; ok {
		t.Error("adminToken.existingSecret set, but the chart creates its own admin token Secret")
	}
}

// checkRelease checks what every install promises, with replicas voters.
func checkRelease(t *testing.T, r *rendered, replicas int) {
	t.Helper()
	sts := r.statefulSets["prod-ursula-node"]
	if sts == nil {
		t.Fatalf("no StatefulSet prod-ursula-node (have %v)", keys(r.statefulSets))
	}
	if sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != replicas {
		t.Errorf("voters %v, want %d", sts.Spec.Replicas, replicas)
	}
	pod := &sts.Spec.Template.Spec
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds != 30 {
		t.Errorf("terminationGracePeriodSeconds %v, want 30", pod.TerminationGracePeriodSeconds)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q, want Parallel (a group initializes once every voter answers)", sts.Spec.PodManagementPolicy)
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Command, []string{"/usr/local/bin/ursula-node", "-config", "/etc/ursula/config/node.toml"}) {
		t.Errorf("node command %q", c.Command)
	}
	p := c.ReadinessProbe
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/__ursula/ready" || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Fatalf("node readiness probe %+v: want HTTPS GET /__ursula/ready", p)
	}
	if port := containerPort(c, p.HTTPGet.Port.String()); port != 4437 {
		t.Errorf("readiness probe port %q is container port %d, want the client plane 4437", p.HTTPGet.Port.String(), port)
	}
	if containerPort(c, "cluster") != 4439 {
		t.Errorf("cluster port %d, want 4439", containerPort(c, "cluster"))
	}
	if pod.Affinity == nil || pod.Affinity.PodAntiAffinity == nil ||
		len(pod.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution)+len(pod.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Errorf("voters have no pod anti-affinity: %+v", pod.Affinity)
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || !mountsAt(c, sts.Spec.VolumeClaimTemplates[0].Name, "/var/lib/ursula") {
		t.Errorf("every voter needs a PVC for its WAL at /var/lib/ursula: claims %d", len(sts.Spec.VolumeClaimTemplates))
	}
	podLabels := labels.Set(sts.Spec.Template.Labels)

	// The PodDisruptionBudget: one voter at a time, selecting the voters.
	pdb := r.pdbs["prod-ursula-node"]
	if pdb == nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Fatalf("PDB %+v: want maxUnavailable 1", pdb)
	}
	if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("PDB selector %v does not select the voters (%v)", pdb.Spec.Selector, err)
	}
	if sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("StatefulSet selector %v does not select its pods", sts.Spec.Selector)
	}
	headless := r.services[sts.Spec.ServiceName]
	if headless == nil || headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses ||
		!labels.SelectorFromSet(headless.Spec.Selector).Matches(podLabels) {
		t.Errorf("headless Service %q: %+v", sts.Spec.ServiceName, headless)
	}

	// Node ids from the ordinal, peers by their stable DNS names.
	cm := r.configMaps["prod-ursula-config"]
	node := parseTOML(t, cm.Data["node.toml"])
	if dig(node, "raft", "node_id_from_hostname") != true {
		t.Errorf("raft.node_id_from_hostname = %v, want true", dig(node, "raft", "node_id_from_hostname"))
	}
	if dig(node, "raft", "node_id") != nil {
		t.Error("node.toml sets raft.node_id: the ordinal names the node")
	}
	if dig(node, "server", "cluster_id") != "test-cluster" && dig(node, "server", "cluster_id") != "prod-eu-1" {
		t.Errorf("server.cluster_id %v", dig(node, "server", "cluster_id"))
	}
	if dig(node, "runtime", "core_count") != int64(4) || dig(node, "raft", "group_count") != int64(64) {
		t.Errorf("core_count %v, group_count %v: the chart defaults are 4 and 64", dig(node, "runtime", "core_count"), dig(node, "raft", "group_count"))
	}
	peers, _ := dig(node, "raft", "peers").([]map[string]any)
	if len(peers) != replicas {
		t.Fatalf("%d [[raft.peers]], want %d", len(peers), replicas)
	}
	var upstream []string
	for i, p := range peers {
		host := fmt.Sprintf("prod-ursula-node-%d.%s.%s.svc", i, sts.Spec.ServiceName, namespace)
		if p["id"] != int64(i+1) || p["cluster_url"] != host+":4439" || p["client_url"] != host+":4437" {
			t.Errorf("peer %d: %v, want id %d at %s", i, p, i+1, host)
		}
		upstream = append(upstream, host+":4437")
	}
	gw := parseTOML(t, cm.Data["gateway.toml"])
	if got := fmt.Sprint(dig(gw, "upstream", "nodes")); got != fmt.Sprint(upstream) {
		t.Errorf("gateway upstream.nodes %s, want %v", got, upstream)
	}

	// Each voter mounts its own Secret, as its pod-named subdirectory.
	var tlsSecrets []string
	for _, v := range pod.Volumes {
		if v.Projected != nil && v.Name == "tls" {
			for _, s := range v.Projected.Sources {
				tlsSecrets = append(tlsSecrets, s.Secret.Name)
				for _, item := range s.Secret.Items {
					if !strings.HasPrefix(item.Path, fmt.Sprintf("prod-ursula-node-%d/", len(tlsSecrets)-1)) {
						t.Errorf("Secret %s item %s outside its pod's directory", s.Secret.Name, item.Path)
					}
				}
			}
		}
	}
	if len(tlsSecrets) != replicas {
		t.Errorf("voter TLS Secrets %v, want one per voter", tlsSecrets)
	}
	for _, m := range c.VolumeMounts {
		if m.Name == "tls" && m.SubPathExpr != "$(POD_NAME)" {
			t.Errorf("the voter TLS mount takes subPathExpr %q, want $(POD_NAME)", m.SubPathExpr)
		}
	}

	// Every container execs one of the image's binaries (it has no shell).
	var specs []*corev1.PodSpec
	specs = append(specs, pod)
	for _, d := range r.deployments {
		specs = append(specs, &d.Spec.Template.Spec)
		if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("Deployment %s selector does not select its pods", d.Name)
		}
	}
	for _, p := range r.pods {
		specs = append(specs, &p.Spec)
	}
	binaries := []string{"ursula", "ursula-node", "ursula-gateway", "ursula-coldgc", "ursula-backup", "ursulactl"}
	for _, s := range specs {
		for _, c := range s.Containers {
			if len(c.Command) == 0 || !slices.Contains(binaries, strings.TrimPrefix(c.Command[0], "/usr/local/bin/")) || !strings.HasPrefix(c.Command[0], "/usr/local/bin/") {
				t.Errorf("container %s runs %q: want one of the image's binaries", c.Name, c.Command)
			}
			if c.SecurityContext == nil || c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
				t.Errorf("container %s may escalate privileges", c.Name)
			}
		}
		// Service links would put URSULA_GATEWAY_* variables (a release
		// named ursula) into the environment, refused as unknown settings.
		if s.EnableServiceLinks == nil || *s.EnableServiceLinks {
			t.Errorf("a pod of %s has Service environment variables (enableServiceLinks)", s.Containers[0].Name)
		}
		if s.SecurityContext == nil || s.SecurityContext.RunAsUser == nil || *s.SecurityContext.RunAsUser != 65532 {
			t.Errorf("a pod of %s does not run as the image's user 65532", s.Containers[0].Name)
		}
		// Every ConfigMap a pod mounts is rendered, with the keys it names.
		for _, v := range s.Volumes {
			if v.ConfigMap == nil {
				continue
			}
			cm := r.configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Errorf("%s mounts ConfigMap %s, not rendered", s.Containers[0].Name, v.ConfigMap.Name)
				continue
			}
			for _, item := range v.ConfigMap.Items {
				if _, ok := cm.Data[item.Key]; !ok {
					t.Errorf("%s mounts key %s of ConfigMap %s, not rendered", s.Containers[0].Name, item.Key, cm.Name)
				}
			}
		}
	}

	// The gateway: readiness on its listener, its Service selecting it.
	gwd := r.deployments["prod-ursula-gateway"]
	if gwd == nil {
		t.Fatalf("no gateway Deployment (have %v)", keys(r.deployments))
	}
	gc := gwd.Spec.Template.Spec.Containers[0]
	if gc.ReadinessProbe == nil || gc.ReadinessProbe.HTTPGet == nil || gc.ReadinessProbe.HTTPGet.Path != "/__ursula/ready" || containerPort(gc, gc.ReadinessProbe.HTTPGet.Port.String()) != 4437 {
		t.Errorf("gateway readiness probe %+v", gc.ReadinessProbe)
	}
	if svc := r.services["prod-ursula-gateway"]; svc == nil || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(gwd.Spec.Template.Labels)) {
		t.Errorf("gateway Service %+v does not select the gateways", svc)
	}

	// helm test: a pod named <chart>-test that waits for the cluster.
	tp := r.pods["prod-ursula-test"]
	if tp == nil {
		t.Fatalf("no helm test pod (pods %v)", keys(r.pods))
	}
	if tp.Annotations["helm.sh/hook"] != "test" {
		t.Errorf("test pod hook %q", tp.Annotations["helm.sh/hook"])
	}
	if tp.Labels["app.kubernetes.io/name"] != chartName+"-test" {
		t.Errorf("test pod name label %q, want %s-test", tp.Labels["app.kubernetes.io/name"], chartName)
	}
	cmd := tp.Spec.Containers[0].Command
	if cmd[0] != "/usr/local/bin/ursulactl" || cmd[len(cmd)-1] != "wait-ready" || !slices.Contains(cmd, "--manifest") {
		t.Errorf("test pod runs %q, want ursulactl --manifest ... wait-ready", cmd)
	}
	manifest := parseTOML(t, r.configMaps["prod-ursula-manifest"].Data["manifest.toml"])
	nodes, _ := manifest["nodes"].([]map[string]any)
	if len(nodes) != replicas || manifest["cluster_id"] != dig(node, "server", "cluster_id") {
		t.Errorf("ursulactl manifest: %d nodes, cluster %v", len(nodes), manifest["cluster_id"])
	}
	for i, n := range nodes {
		if n["id"] != int64(i+1) || n["client_url"] != "https://"+upstream[i] {
			t.Errorf("manifest node %d: %v", i, n)
		}
	}
}

// TestSchemaRejects checks that values.schema.json refuses invalid values
// and that the refusal names the value.
func TestSchemaRejects(t *testing.T) {
	tests := []struct {
		name string
		set  func(v map[string]any)
		want []string // all in the error
	}{
		{"missing clusterId", func(v map[string]any) { delete(sub(v, "server"), "clusterId") }, []string{"clusterId"}},
		{"empty clusterId", func(v map[string]any) { sub(v, "server")["clusterId"] = "" }, []string{"clusterId"}},
		{"unknown key under raft", func(v map[string]any) { sub(v, "raft")["storageMode"] = "disk" }, []string{"raft", "storageMode"}},
		{"unknown key under persistence", func(v map[string]any) { sub(v, "persistence")["enabled"] = false }, []string{"persistence", "enabled"}},
		{"unknown top-level key", func(v map[string]any) { v["indexer"] = map[string]any{} }, []string{"indexer"}},
		{"walFsync not in enum", func(v map[string]any) { sub(v, "raft")["walFsync"] = "sometimes" }, []string{"walFsync"}},
		{"two voters", func(v map[string]any) { sub(v, "node")["replicas"] = 2 }, []string{"replicas"}},
		{"four voters", func(v map[string]any) { sub(v, "node")["replicas"] = 4 }, []string{"replicas"}},
		{"negative abort cap", func(v map[string]any) { sub(v, "runtime")["nodeMemoryAbortCapSize"] = -1 }, []string{"nodeMemoryAbortCapSize"}},
		{"body limit above 32 MiB", func(v map[string]any) { sub(v, "gateway")["maxRequestBodyBytes"] = 33554433 }, []string{"maxRequestBodyBytes"}},
		{"fs cold store with five voters", func(v map[string]any) { sub(sub(v, "storage"), "cold")["backend"] = "fs" }, []string{"replicas"}},
		{"s3 without a bucket", func(v map[string]any) { sub(sub(sub(v, "storage"), "cold"), "s3")["bucket"] = "" }, []string{"bucket"}},
		{"cold-GC on fs", func(v map[string]any) {
			sub(v, "node")["replicas"] = 1
			sub(sub(v, "storage"), "cold")["backend"] = "fs"
		}, []string{"backend"}},
		{"backup to a directory", func(v map[string]any) { sub(v, "backup")["location"] = "/backups" }, []string{"location"}},
		{"HPA without a CPU request", func(v map[string]any) { delete(sub(sub(sub(v, "gateway"), "resources"), "requests"), "cpu") }, []string{"cpu"}},
		{"bad duration", func(v map[string]any) { sub(v, "raft")["deletedDataMaxAge"] = "an hour" }, []string{"deletedDataMaxAge"}},
		{"cluster port out of range", func(v map[string]any) { sub(sub(v, "server"), "ports")["cluster"] = 70000 }, []string{"cluster"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Start from the production values (valid), break one thing.
			vals := readValues(t, "ci/production-values.yaml")
			tc.set(vals)
			_, err := render(t, vals)
			if err == nil {
				t.Fatal("rendered; want the schema to refuse the values")
			}
			t.Logf("refused: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
			// helm lint refuses them as well.
			lint := action.NewLint()
			lint.Strict = true
			if res := lint.Run([]string{chartDir}, vals); len(res.Errors) == 0 {
				t.Error("helm lint --strict accepts the values")
			}
		})
	}
	t.Run("production values are valid", func(t *testing.T) {
		if _, err := render(t, readValues(t, "ci/production-values.yaml")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("three voters on s3", func(t *testing.T) {
		manifest, err := render(t, threeVoters())
		if err != nil {
			t.Fatal(err)
		}
		checkRelease(t, decodeAll(t, manifest), 3)
	})
}

// TestReadmeListsEveryValue keeps the chart's README table in step with
// values.yaml: every value (a leaf, an empty table or a list) has a row.
func TestReadmeListsEveryValue(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var leaves []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
				walk(prefix+k+".", sub)
				continue
			}
			leaves = append(leaves, prefix+k)
		}
	}
	walk("", readValues(t, "values.yaml"))
	if len(leaves) < 50 {
		t.Fatalf("only %d values found: %v", len(leaves), leaves)
	}
	for _, v := range leaves {
		if !bytes.Contains(readme, []byte("| `"+v+"` |")) {
			t.Errorf("README.md has no row for %s", v)
		}
	}
}

// TestDecodeStrictRefuses shows that the decoding the rendered objects go
// through refuses what the API server would not take silently.
func TestDecodeStrictRefuses(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown nested field": "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: a}\nspec:\n  template:\n    spec:\n      terminationGracePeriodSecond: 30\n",
		"duplicate field":      "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {a: x}\ndata: {b: y}\n",
		"wrong type":           "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: a}\nspec: {maxUnavailable: [1]}\n",
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			switch {
			case strings.Contains(doc, "StatefulSet"):
				_, err = decodeStrict[appsv1.StatefulSet]([]byte(doc))
			case strings.Contains(doc, "ConfigMap"):
				_, err = decodeStrict[corev1.ConfigMap]([]byte(doc))
			default:
				_, err = decodeStrict[policyv1.PodDisruptionBudget]([]byte(doc))
			}
			if err == nil {
				t.Fatal("decoded")
			}
		})
	}
}

// TestLongNames renders with the longest full name the schema allows: the
// StatefulSet's name leaves room for its pods' revision label (at most 52
// characters) and every name stays valid.
func TestLongNames(t *testing.T) {
	vals := threeVoters()
	vals["fullnameOverride"] = strings.Repeat("u", 40)
	manifest, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeAll(t, manifest)
	for name := range r.statefulSets {
		if len(name) > 52 {
			t.Errorf("StatefulSet name %q is longer than 52", name)
		}
	}
	vals["fullnameOverride"] = strings.Repeat("u", 41)
	if _, err := render(t, vals); err == nil || !strings.Contains(err.Error(), "fullnameOverride") {
		t.Errorf("a 41-character fullnameOverride: %v, want a schema refusal", err)
	}
}
