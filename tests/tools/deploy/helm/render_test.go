package helm

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	kubefake "helm.sh/helm/v3/pkg/kube/fake"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// chartDir is the chart under test, relative to this package.
const chartDir = "../../../../deploy/helm/ursula"

const (
	releaseName = "prod"
	namespace   = "streams"
	chartName   = "ursula"
)

// rendered is one release's objects, decoded.
type rendered struct {
	objects      []object
	statefulSets map[string]*appsv1.StatefulSet
	deployments  map[string]*appsv1.Deployment
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	pods         map[string]*corev1.Pod // hooks: the helm test pod
	pdbs         map[string]*policyv1.PodDisruptionBudget
	hpas         map[string]*autoscalingv2.HorizontalPodAutoscaler
	netpols      map[string]*networkingv1.NetworkPolicy
}

// object is one decoded document and where it came from.
type object struct {
	source string
	kind   string
	meta   *metav1.ObjectMeta
	typed  any
}

func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

// readValues reads a values file of the chart.
func readValues(t testing.TB, name string) map[string]any {
	t.Helper()
	vals, err := chartutil.ReadValuesFile(filepath.Join(chartDir, name))
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return vals
}

// minimalValues are the values an install must give: the cluster id.
func minimalValues() map[string]any {
	return map[string]any{"server": map[string]any{"clusterId": "test-cluster"}}
}

// render renders the chart like `helm template`, hooks included.
func render(t testing.TB, vals map[string]any) (string, error) {
	t.Helper()
	cfg := &action.Configuration{
		Releases:     storage.Init(driver.NewMemory()),
		KubeClient:   &kubefake.PrintingKubeClient{Out: new(bytes.Buffer)},
		Capabilities: chartutil.DefaultCapabilities,
		Log:          func(string, ...any) {},
	}
	install := action.NewInstall(cfg)
	install.DryRun = true
	install.DryRunOption = "client"
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = releaseName
	install.Namespace = namespace
	rel, err := install.Run(loadChart(t), vals)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	out.WriteString(rel.Manifest)
	for _, h := range rel.Hooks {
		fmt.Fprintf(&out, "\n---\n# Source: %s\n%s\n", h.Path, h.Manifest)
	}
	return out.String(), nil
}

// decodeStrict decodes doc into a new T, refusing unknown and duplicate
// fields.
func decodeStrict[T any](doc []byte) (*T, error) {
	v := new(T)
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		return nil, err
	}
	return v, nil
}

var sourceRE = regexp.MustCompile(`(?m)^# Source: (.*)$`)

// decodeAll decodes every document of a rendered release by its
// apiVersion and kind; a kind the chart should not render fails.
func decodeAll(t testing.TB, manifest string) *rendered {
	t.Helper()
	r := &rendered{
		statefulSets: map[string]*appsv1.StatefulSet{},
		deployments:  map[string]*appsv1.Deployment{},
		services:     map[string]*corev1.Service{},
		configMaps:   map[string]*corev1.ConfigMap{},
		secrets:      map[string]*corev1.Secret{},
		pods:         map[string]*corev1.Pod{},
		pdbs:         map[string]*policyv1.PodDisruptionBudget{},
		hpas:         map[string]*autoscalingv2.HorizontalPodAutoscaler{},
		netpols:      map[string]*networkingv1.NetworkPolicy{},
	}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(manifest, -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		source := "?"
		if m := sourceRE.FindStringSubmatch(doc); m != nil {
			source = m[1]
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s: not YAML: %v\n%s", source, err, doc)
		}
		o := object{source: source, kind: tm.Kind}
		var err error
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 StatefulSet":
			var v *appsv1.StatefulSet
			if v, err = decodeStrict[appsv1.StatefulSet]([]byte(doc)); err == nil {
				r.statefulSets[v.Name], o.meta, o.typed = v, &v.ObjectMeta, v
			}
		case "apps/v1 Deployment":
			var v *appsv1.Deployment
			if v, err = decodeStrict[appsv1.Deployment]([]byte(doc)); err == nil {
				r.deployments[v.Name], o.meta, o.typed = v, &v.ObjectMeta, v
			}
		case "v1 Service":
			var v *corev1.Service
			if v, err = decodeStrict[corev1.Service]([]byte(doc)); err == nil {
				r.services[v.Name], o.meta, o.typed = v, &v.ObjectMeta, v
			}
		case "v1 ConfigMap":
			var v *corev1.ConfigMap
			if v, err = decodeStrict[corev1.ConfigMap]([]byte(doc)); err == nil {
				r.configMaps[v.Name], o.meta, o.typed = v, &v.ObjectMeta, v
			}
		case "v1 Secret":
			var v *corev1.Secret
			if v, err = decodeStrict[corev1.Secret]([]byte(doc)); err == nil {
				r.secrets[v.Name], o.meta, o.typed = v, &v.ObjectMeta, v
			}
		case "v1 ServiceAccount":
			var v *corev1.ServiceAccount
			if v, err = decodeStrict[corev1.ServiceAccount]([]byte(doc)); err == nil {
				o.meta, o.typed = &v.ObjectMeta, v
			}
		case "v1 Pod":
			var v *corev1.Pod
			if v, err = decodeStrict[corev1.Pod]([]byte(doc)); err == nil {
				r.pods[v.Name], o.meta, o.typed = v, &v.ObjectMeta, v
			}
		case "policy/v1 PodDisruptionBudget":
			var v *policyv1.PodDisruptionBudget
			if v, err = decodeStrict[policyv1.PodDisruptionBudget]([]byte(doc)); err == nil {
				r.pdbs[v.Name], o.meta, o.typed = v, &v.ObjectMeta, v
			}
		case "autoscaling/v2 HorizontalPodAutoscaler":
			var v *autoscalingv2.HorizontalPodAutoscaler
			if v, err = decodeStrict[autoscalingv2.HorizontalPodAutoscaler]([]byte(doc)); err == nil {
				r.hpas[v.Name], o.meta, o.typed = v, &v.ObjectMeta, v
			}
		case "networking.k8s.io/v1 NetworkPolicy":
			var v *networkingv1.NetworkPolicy
			if v, err = decodeStrict[networkingv1.NetworkPolicy]([]byte(doc)); err == nil {
				r.netpols[v.Name], o.meta, o.typed = v, &v.ObjectMeta, v
			}
		default:
			t.Fatalf("%s: unexpected object %s %s", source, tm.APIVersion, tm.Kind)
		}
		if err != nil {
			t.Fatalf("%s: strict decode of %s: %v", source, tm.Kind, err)
		}
		checkMeta(t, o)
		r.objects = append(r.objects, o)
	}
	return r
}

// checkMeta checks what the API server would refuse in an object's
// metadata: the syntax of its name and labels.
func checkMeta(t testing.TB, o object) {
	t.Helper()
	if errs := validation.IsDNS1123Subdomain(o.meta.Name); len(errs) > 0 {
		t.Errorf("%s: %s name %q: %v", o.source, o.kind, o.meta.Name, errs)
	}
	if len(o.meta.Name) > 63 && o.kind != "ConfigMap" && o.kind != "Secret" {
		t.Errorf("%s: %s name %q is longer than 63", o.source, o.kind, o.meta.Name)
	}
	for k, v := range o.meta.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%s: label key %q: %v", o.source, k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%s: label %s=%q: %v", o.source, k, v, errs)
		}
	}
}

// threeVoters are the smallest values of a replicated cluster.
func threeVoters() map[string]any {
	vals := minimalValues()
	vals["node"] = map[string]any{"replicas": 3}
	vals["storage"] = map[string]any{"cold": map[string]any{"backend": "s3", "s3": map[string]any{"bucket": "streams"}}}
	return vals
}

func parseTOML(t testing.TB, text string) map[string]any {
	t.Helper()
	var m map[string]any
	if _, err := toml.Decode(text, &m); err != nil {
		t.Fatalf("rendered TOML: %v\n%s", err, text)
	}
	return m
}

// dig returns the value at a path of nested tables (nil if absent).
func dig(m map[string]any, path ...string) any {
	var cur any = m
	for _, k := range path {
		t, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = t[k]
	}
	return cur
}

// sub returns v[k] as a table, creating it.
func sub(v map[string]any, k string) map[string]any {
	if m, ok := v[k].(map[string]any); ok {
		return m
	}
	m := map[string]any{}
	v[k] = m
	return m
}

func containerPort(c corev1.Container, nameOrNumber string) int32 {
	for _, p := range c.Ports {
		if p.Name == nameOrNumber || fmt.Sprint(p.ContainerPort) == nameOrNumber {
			return p.ContainerPort
		}
	}
	return 0
}

func mountsAt(c corev1.Container, volume, path string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volume && m.MountPath == path })
}

func secretVolumes(s *corev1.PodSpec) []string {
	var out []string
	for _, v := range s.Volumes {
		if v.Secret != nil {
			out = append(out, v.Secret.SecretName)
		}
	}
	return out
}

func keys[V any](m map[string]V) []string { return slices.Sorted(mapKeys(m)) }

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
