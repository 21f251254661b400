package validate

import (
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Least privilege (issue 64, defect 4): only the daemon sees and signals
// the node's processes; the uplink runs as a user of its own in the tier's
// group; every pod of cxltier's that listens is behind a NetworkPolicy.

// SharedGroupEnv is the environment variable naming the tier's group.
const SharedGroupEnv = "CXLTIER_SHARED_GROUP"

// daemonOnlyCaps are the capabilities that reach other processes: only
// cxltierd, which proves and ends stalled clients, may add them.
var daemonOnlyCaps = []corev1.Capability{"KILL", "SYS_PTRACE", "SYS_ADMIN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "SETUID", "SETGID"}

func isDaemon(c corev1.Container) bool {
	return len(c.Command) > 0 && c.Command[0] == "cxltierd"
}

func isUplink(c corev1.Container) bool {
	return slices.Contains(append(append([]string{}, c.Command...), c.Args...), "cxltier.cluster.uplink")
}

func allContainers(spec corev1.PodSpec) []corev1.Container {
	return append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
}

// checkPrivilege holds hostPID and the capabilities that reach other
// processes to the daemon, the uplink to a non-root user in the tier's
// group, and the daemon to membership of the group it gives the tier to.
func checkPrivilege(o Object, bad func(Object, string, ...any)) {
	spec := o.Pod.Spec
	for _, c := range allContainers(spec) {
		if spec.HostPID && !isDaemon(c) {
			bad(o, "hostPID in a pod that runs container %q besides the daemon: it could see and signal every process of the node", c.Name)
		}
		if sc := c.SecurityContext; sc != nil && sc.Capabilities != nil && !isDaemon(c) {
			for _, cap := range sc.Capabilities.Add {
				if slices.Contains(daemonOnlyCaps, cap) {
					bad(o, "container %q adds capability %s, which only the daemon needs", c.Name, cap)
				}
			}
		}
		group, named := envValue(c, SharedGroupEnv)
		switch {
		case isUplink(c):
			checkUplinkUser(o, spec, c, group, named, bad)
		case isDaemon(c) && named:
			if gid, err := strconv.ParseInt(group, 10, 64); err != nil || !inGroup(spec, c, gid) {
				bad(o, "container %q gives the tier to group %s (%s), which it is not in (supplementalGroups)", c.Name, group, SharedGroupEnv)
			}
		}
	}
}

func checkUplinkUser(o Object, spec corev1.PodSpec, c corev1.Container, group string, named bool, bad func(Object, string, ...any)) {
	user, gid := runAs(spec, c)
	if user == nil || *user == 0 {
		bad(o, "container %q: an uplink running as root (runAsUser unset or 0): it needs only the tier's group", c.Name)
		return
	}
	if !named || gid == nil || strconv.FormatInt(*gid, 10) != group {
		bad(o, "container %q: an uplink not in the tier's group: runAsGroup and %s must name the same gid (the daemon's sockets trust that group)", c.Name, SharedGroupEnv)
	}
}

// runAs is the user and group a container runs as: its own settings, else
// its pod's.
func runAs(spec corev1.PodSpec, c corev1.Container) (user, group *int64) {
	if p := spec.SecurityContext; p != nil {
		user, group = p.RunAsUser, p.RunAsGroup
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			user = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			group = sc.RunAsGroup
		}
	}
	return user, group
}

func inGroup(spec corev1.PodSpec, c corev1.Container, gid int64) bool {
	if _, g := runAs(spec, c); g != nil && *g == gid {
		return true
	}
	return spec.SecurityContext != nil && slices.Contains(spec.SecurityContext.SupplementalGroups, gid)
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// checkGuarded holds every cxltier workload whose pods listen (declare a
// container port) to a NetworkPolicy of its file that selects them and
// governs their ingress.
func checkGuarded(o Object, objs []Object, bad func(Object, string, ...any)) {
	if o.Meta.Labels["app.kubernetes.io/part-of"] != "cxltier" || !listens(o.Pod.Spec) {
		return
	}
	for _, p := range objs {
		if np, ok := p.Obj.(*networkingv1.NetworkPolicy); ok && p.Meta.Namespace == o.Meta.Namespace &&
			governsIngress(np) && selects(&np.Spec.PodSelector, o.Pod.Labels) {
			return
		}
	}
	bad(o, "its pods listen on ports and no NetworkPolicy of this file guards their ingress")
}

func listens(spec corev1.PodSpec) bool {
	for _, c := range allContainers(spec) {
		if len(c.Ports) > 0 {
			return true
		}
	}
	return false
}

func governsIngress(np *networkingv1.NetworkPolicy) bool {
	return len(np.Spec.PolicyTypes) == 0 || slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
}

func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !s.Empty() && s.Matches(labels.Set(l))
}

// checkPolicy holds a NetworkPolicy to the pods of its file: it selects
// some, and lets nobody in from everywhere on every port (a rule with
// neither peers nor ports).
func checkPolicy(o Object, np *networkingv1.NetworkPolicy, objs []Object, bad func(Object, string, ...any)) {
	found := false
	for _, w := range objs {
		if w.Pod != nil && w.Meta.Namespace == o.Meta.Namespace && selects(&np.Spec.PodSelector, w.Pod.Labels) {
			found = true
		}
	}
	if !found {
		bad(o, "selects no pod of this file")
	}
	for i, r := range np.Spec.Ingress {
		if len(r.From) == 0 && len(r.Ports) == 0 {
			bad(o, "ingress rule %d admits everything (no peers, no ports)", i+1)
		}
	}
}

// CrossCheck runs the checks that span files: every NetworkPolicy peer
// selects some pod of the manifests, whatever guards the Mooncake master
// admits every uplink, and every process of the tier trusts the uplinks'
// group.
func CrossCheck(files map[string][]Object) []error {
	var errs []error
	var pods []Object
	var policies []Object
	for _, objs := range files {
		for _, o := range objs {
			if o.Pod != nil {
				pods = append(pods, o)
			}
			if _, ok := o.Obj.(*networkingv1.NetworkPolicy); ok {
				policies = append(policies, o)
			}
		}
	}
	errs = append(errs, checkTierClients(pods)...)
	for _, p := range policies {
		np := p.Obj.(*networkingv1.NetworkPolicy)
		for _, r := range np.Spec.Ingress {
			for _, peer := range r.From {
				if peer.PodSelector != nil && peer.NamespaceSelector == nil && !anySelected(peer.PodSelector, p.Meta.Namespace, pods) {
					errs = append(errs, fmt.Errorf("NetworkPolicy %q: admits pods %v, which no manifest runs", p.Name, metav1.FormatLabelSelector(peer.PodSelector)))
				}
			}
		}
		if !guardsMaster(np, p.Meta.Namespace, pods) {
			continue
		}
		for _, w := range pods {
			if slices.ContainsFunc(allContainers(w.Pod.Spec), isUplink) && !admits(np, p.Meta.Namespace, w) {
				errs = append(errs, fmt.Errorf("NetworkPolicy %q guards the Mooncake master and keeps out %s %q's uplinks", p.Name, w.Kind, w.Name))
			}
		}
	}
	return errs
}

func anySelected(sel *metav1.LabelSelector, ns string, pods []Object) bool {
	return slices.ContainsFunc(pods, func(w Object) bool { return w.Meta.Namespace == ns && selects(sel, w.Pod.Labels) })
}

func guardsMaster(np *networkingv1.NetworkPolicy, ns string, pods []Object) bool {
	return slices.ContainsFunc(pods, func(w Object) bool {
		return w.Meta.Namespace == ns && selects(&np.Spec.PodSelector, w.Pod.Labels) &&
			slices.ContainsFunc(w.Pod.Spec.Containers, func(c corev1.Container) bool {
				return len(c.Command) > 0 && c.Command[0] == "mooncake_master"
			})
	})
}

func admits(np *networkingv1.NetworkPolicy, ns string, w Object) bool {
	for _, r := range np.Spec.Ingress {
		for _, peer := range r.From {
			if peer.PodSelector != nil && peer.NamespaceSelector == nil && w.Meta.Namespace == ns && selects(peer.PodSelector, w.Pod.Labels) {
				return true
			}
		}
	}
	return false
}

// checkTierClients holds every container that names a tier device, uplinks
// aside, to the uplinks' group: a process of the tier trusts a non-root
// uplink's socket only where CXLTIER_SHARED_GROUP names its group, and
// maps a tier of that group only where it is named (or it is root).
func checkTierClients(pods []Object) []error {
	groups := map[string]bool{}
	for _, w := range pods {
		for _, c := range allContainers(w.Pod.Spec) {
			if g, ok := envValue(c, SharedGroupEnv); ok && isUplink(c) {
				groups[g] = true
			}
		}
	}
	if len(groups) == 0 {
		return nil
	}
	var errs []error
	for _, w := range pods {
		for _, c := range allContainers(w.Pod.Spec) {
			if isUplink(c) || !namesTier(c) {
				continue
			}
			if g, _ := envValue(c, SharedGroupEnv); !groups[g] {
				errs = append(errs, fmt.Errorf("%s %q: container %q uses the tier and its %s (%q) is not the uplinks' group: it refuses their sockets",
					w.Kind, w.Name, c.Name, SharedGroupEnv, g))
			}
		}
	}
	return errs
}

func namesTier(c corev1.Container) bool {
	return slices.ContainsFunc(containerTexts(c), tierDevice.MatchString)
}
