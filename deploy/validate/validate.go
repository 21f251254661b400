// Package validate checks cxltier's Kubernetes manifests (deploy/kubernetes)
// against the Kubernetes API types themselves: every object decodes
// strictly (an unknown or misspelt field is an error, as the API server's
// strict field validation makes it), and the objects of a file agree with
// each other (mounts name volumes, selectors select their pods, references
// to ConfigMaps and ports resolve, a tier device sits under a mount). It is
// a module of its own so that the library's dependencies do not grow.
package validate

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Object is one decoded manifest object.
type Object struct {
	Kind string
	Name string
	Meta metav1.ObjectMeta
	Pod  *corev1.PodTemplateSpec // workloads only
	Obj  any
}

// NameLabel is the label every object carries.
const NameLabel = "app.kubernetes.io/name"

// Decode splits a multi-document YAML file and decodes each document
// strictly into its API type.
func Decode(raw []byte) ([]Object, error) {
	var out []Object
	for i, doc := range splitDocuments(raw) {
		o, err := decodeOne(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		out = append(out, o)
	}
	if len(out) == 0 {
		return nil, errors.New("no objects")
	}
	return out, nil
}

func splitDocuments(raw []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(raw), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func decodeOne(doc []byte) (Object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return Object{}, err
	}
	var o Object
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 Namespace":
		var v corev1.Namespace
		o = Object{Obj: &v}
		if err := strict(doc, &v); err != nil {
			return o, err
		}
		o.Meta = v.ObjectMeta
	case "v1 ConfigMap":
		var v corev1.ConfigMap
		if err := strict(doc, &v); err != nil {
			return o, err
		}
		o = Object{Meta: v.ObjectMeta, Obj: &v}
	case "v1 Service":
		var v corev1.Service
		if err := strict(doc, &v); err != nil {
			return o, err
		}
		o = Object{Meta: v.ObjectMeta, Obj: &v}
	case "apps/v1 DaemonSet":
		var v appsv1.DaemonSet
		if err := strict(doc, &v); err != nil {
			return o, err
		}
		o = Object{Meta: v.ObjectMeta, Pod: &v.Spec.Template, Obj: &v}
	case "apps/v1 Deployment":
		var v appsv1.Deployment
		if err := strict(doc, &v); err != nil {
			return o, err
		}
		o = Object{Meta: v.ObjectMeta, Pod: &v.Spec.Template, Obj: &v}
	case "networking.k8s.io/v1 NetworkPolicy":
		var v networkingv1.NetworkPolicy
		if err := strict(doc, &v); err != nil {
			return o, err
		}
		o = Object{Meta: v.ObjectMeta, Obj: &v}
	default:
		return Object{}, fmt.Errorf("apiVersion %q kind %q: not a kind these manifests use", tm.APIVersion, tm.Kind)
	}
	o.Kind, o.Name = tm.Kind, o.Meta.Name
	return o, nil
}

// strict decodes doc into v as the API server's strict field validation
// does: field names match case-sensitively (encoding/json would take
// "hostPid" for hostPID), and unknown or duplicate fields are errors.
func strict(doc []byte, v any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("strict decoding: %w", err)
	}
	strictErrs, err := kjson.UnmarshalStrict(js, v)
	if err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	if len(strictErrs) > 0 {
		return fmt.Errorf("strict decoding: %w", errors.Join(strictErrs...))
	}
	return nil
}

// Check runs the cross-checks on the objects of one file and returns every
// problem found.
func Check(objs []Object) []error {
	var errs []error
	bad := func(o Object, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s %q: %s", o.Kind, o.Name, fmt.Sprintf(format, a...)))
	}
	configMaps := map[string]*corev1.ConfigMap{}
	for _, o := range objs {
		if cm, ok := o.Obj.(*corev1.ConfigMap); ok {
			configMaps[o.Meta.Namespace+"/"+o.Name] = cm
		}
	}
	for _, o := range objs {
		if o.Name == "" {
			bad(o, "no name")
		}
		if o.Meta.Labels[NameLabel] == "" {
			bad(o, "no %s label", NameLabel)
		}
		if o.Kind != "Namespace" && o.Meta.Namespace == "" {
			bad(o, "no namespace")
		}
		switch v := o.Obj.(type) {
		case *appsv1.DaemonSet:
			checkSelector(o, v.Spec.Selector, bad)
		case *appsv1.Deployment:
			checkSelector(o, v.Spec.Selector, bad)
		case *corev1.Service:
			if len(v.Spec.Selector) == 0 {
				bad(o, "selects no pods")
			}
		case *networkingv1.NetworkPolicy:
			checkPolicy(o, v, objs, bad)
		}
		if o.Pod != nil {
			checkPod(o, configMaps, bad)
			checkPrivilege(o, bad)
			checkGuarded(o, objs, bad)
		}
	}
	return errs
}

func checkSelector(o Object, sel *metav1.LabelSelector, bad func(Object, string, ...any)) {
	if sel == nil {
		bad(o, "no selector")
		return
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		bad(o, "selector: %v", err)
		return
	}
	if s.Empty() || !s.Matches(labels.Set(o.Pod.Labels)) {
		bad(o, "its selector %v does not select its own pods (labels %v)", s, o.Pod.Labels)
	}
}

func checkPod(o Object, configMaps map[string]*corev1.ConfigMap, bad func(Object, string, ...any)) {
	spec := o.Pod.Spec
	volumes := map[string]corev1.Volume{}
	charDevice := false
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
		if v.HostPath != nil && v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathCharDev {
			charDevice = true
		}
		if v.ConfigMap != nil {
			cm := configMaps[o.Meta.Namespace+"/"+v.ConfigMap.Name]
			if cm == nil {
				bad(o, "volume %q: no ConfigMap %q in this file", v.Name, v.ConfigMap.Name)
				continue
			}
			for _, it := range v.ConfigMap.Items {
				if _, ok := cm.Data[it.Key]; !ok {
					bad(o, "volume %q: ConfigMap %q has no key %q", v.Name, cm.Name, it.Key)
				}
			}
		}
	}
	names := map[string]bool{}
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	if len(spec.Containers) == 0 {
		bad(o, "no containers")
	}
	for _, c := range all {
		where := fmt.Sprintf("container %q", c.Name)
		if names[c.Name] {
			bad(o, "%s: two containers of that name", where)
		}
		names[c.Name] = true
		if c.Image == "" {
			bad(o, "%s: no image", where)
		}
		req, lim := c.Resources.Requests, c.Resources.Limits
		if req.Cpu().IsZero() || req.Memory().IsZero() {
			bad(o, "%s: no cpu and memory request", where)
		}
		if m, ok := lim[corev1.ResourceMemory]; ok && m.Cmp(*req.Memory()) < 0 {
			bad(o, "%s: memory limit %v below its request %v", where, m.String(), req.Memory().String())
		}
		if sc := c.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged && !charDevice {
			bad(o, "%s: privileged, with no device to need it", where)
		}
		mounts := map[string]bool{}
		for _, m := range c.VolumeMounts {
			if _, ok := volumes[m.Name]; !ok {
				bad(o, "%s: mounts volume %q, which the pod does not have", where, m.Name)
			}
			mounts[m.MountPath] = true
		}
		checkDevices(o, c, mounts, bad)
		checkRefs(o, c, configMaps, bad)
		checkUplink(o, c, volumes, bad)
		ports := map[string]bool{}
		for _, p := range c.Ports {
			ports[p.Name] = true
		}
		for _, pr := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
			if pr == nil {
				continue
			}
			var port *intOrName
			if pr.HTTPGet != nil {
				port = &intOrName{pr.HTTPGet.Port.StrVal, pr.HTTPGet.Port.IntVal}
			}
			if pr.TCPSocket != nil {
				port = &intOrName{pr.TCPSocket.Port.StrVal, pr.TCPSocket.Port.IntVal}
			}
			if port != nil && port.name != "" && !ports[port.name] {
				bad(o, "%s: a probe names port %q, which it does not declare", where, port.name)
			}
		}
	}
}

// checkUplink holds a cluster uplink (cxltier.cluster.uplink in its command) to
// the cluster's key: --cluster-key naming a file under a mount of a
// Secret volume, read-only. An uplink without it takes any page a process
// that reaches the master puts under a node's key.
func checkUplink(o Object, c corev1.Container, volumes map[string]corev1.Volume, bad func(Object, string, ...any)) {
	args := append(append([]string{}, c.Command...), c.Args...)
	if !slices.Contains(args, "cxltier.cluster.uplink") {
		return
	}
	i := slices.Index(args, "--cluster-key")
	if i < 0 || i+1 >= len(args) {
		bad(o, "container %q: an uplink without --cluster-key (pages between nodes unauthenticated)", c.Name)
		return
	}
	key := args[i+1]
	for _, m := range c.VolumeMounts {
		if v, ok := volumes[m.Name]; ok && v.Secret != nil && strings.HasPrefix(key, strings.TrimSuffix(m.MountPath, "/")+"/") {
			if !m.ReadOnly {
				bad(o, "container %q: the cluster key's Secret is mounted read-write", c.Name)
			}
			return
		}
	}
	bad(o, "container %q: --cluster-key %s is under no mount of a Secret volume", c.Name, key)
}

type intOrName struct {
	name string
	num  int32
}

var tierDevice = regexp.MustCompile(`\b(file|dax):(/[^",\s]+)`)

// checkDevices holds every tier device a container names (in its command,
// arguments and environment) to its mounts: the device sits in (file:) or
// is (dax:) a mounted path.
func checkDevices(o Object, c corev1.Container, mounts map[string]bool, bad func(Object, string, ...any)) {
	for _, t := range containerTexts(c) {
		for _, m := range tierDevice.FindAllStringSubmatch(t, -1) {
			ok := false
			for p := m[2]; !ok; p = path.Dir(p) {
				ok = mounts[p]
				if p == "/" {
					break
				}
			}
			if !ok {
				bad(o, "container %q: names tier device %s, under none of its mounts", c.Name, m[0])
			}
		}
	}
}

// containerTexts is what a container says: its command, arguments and
// environment values.
func containerTexts(c corev1.Container) []string {
	texts := append(append([]string{}, c.Command...), c.Args...)
	for _, e := range c.Env {
		texts = append(texts, e.Value)
	}
	return texts
}

func checkRefs(o Object, c corev1.Container, configMaps map[string]*corev1.ConfigMap, bad func(Object, string, ...any)) {
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.ConfigMapKeyRef
		cm := configMaps[o.Meta.Namespace+"/"+ref.Name]
		switch {
		case cm == nil:
			bad(o, "container %q: env %s: no ConfigMap %q in this file", c.Name, e.Name, ref.Name)
		case !hasKey(cm, ref.Key):
			bad(o, "container %q: env %s: ConfigMap %q has no key %q", c.Name, e.Name, ref.Name, ref.Key)
		}
	}
}

func hasKey(cm *corev1.ConfigMap, key string) bool {
	_, ok := cm.Data[key]
	return ok
}
