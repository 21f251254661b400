package validate

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestManifests: every manifest in deploy/kubernetes decodes strictly into
// the API types and passes the cross-checks, and the serving example mounts
// the tier's host directory where the node's daemon does.
func TestManifests(t *testing.T) {
	files, err := filepath.Glob("../kubernetes/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("manifests: %v, %v", files, err)
	}
	tierDirs := map[string]string{}
	all := map[string][]Object{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := Decode(raw)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		for _, e := range Check(objs) {
			t.Errorf("%s: %v", f, e)
		}
		all[f] = objs
		for _, o := range objs {
			if o.Pod == nil {
				continue
			}
			for _, v := range o.Pod.Spec.Volumes {
				if v.Name == "tier" && v.HostPath != nil {
					tierDirs[f] = v.HostPath.Path
				}
			}
		}
	}
	for _, e := range CrossCheck(all) {
		t.Error(e)
	}
	node, example := tierDirs["../kubernetes/cxltier-node.yaml"], tierDirs["../kubernetes/sglang-example.yaml"]
	if node == "" || node != example {
		t.Errorf("the tier's host directory: %q for the node, %q for the serving example", node, example)
	}
}

// TestRefusals: the validator refuses each kind of mistake it is there
// for, so a manifest that passes has been looked at.
func TestRefusals(t *testing.T) {
	good, err := os.ReadFile("../kubernetes/cxltier-node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"a misspelt field", "hostPID: true", "hostPid: true", "unknown field"},
		{"a field at the wrong level", "      nodeSelector:", "      restartPolicy: Always\n      nodeSelector:\n      nodeselector:", "unknown field"},
		{"an unknown kind", "kind: DaemonSet", "kind: DaemonSets", "not a kind"},
		{"a mount of no volume", "            - name: config\n              mountPath: /etc/cxltier", "            - name: configs\n              mountPath: /etc/cxltier", "does not have"},
		{"a selector that selects nothing", "      app.kubernetes.io/component: node\n  updateStrategy", "      app.kubernetes.io/component: nodes\n  updateStrategy", "does not select"},
		{"a ConfigMap key that is not there", "                  key: mooncake-master", "                  key: mooncake", "has no key"},
		{"a tier outside every mount", "            - file:/cxltier/tier", "            - file:/elsewhere/tier", "under none of its mounts"},
		{"a probe of an undeclared port", "              port: metrics", "              port: metricz", "does not declare"},
		{"an uplink without the cluster key", "            - --cluster-key\n            - /etc/cxltier-cluster/cluster.key\n", "", "without --cluster-key"},
		{"the cluster key outside its Secret", "            - /etc/cxltier-cluster/cluster.key", "            - /etc/elsewhere/cluster.key", "under no mount of a Secret"},
		{"the cluster key's Secret mounted read-write", "              mountPath: /etc/cxltier-cluster\n              readOnly: true", "              mountPath: /etc/cxltier-cluster", "read-write"},
		{"hostPID beside the daemon", "      securityContext:\n        runAsNonRoot: true", "      hostPID: true\n      securityContext:\n        runAsNonRoot: true", "hostPID in a pod that runs container \"uplink\""},
		{"a capability that reaches other processes", "              drop: [\"ALL\"]\n      volumes:\n        - name: tier\n          hostPath:\n            path: /dev/shm/cxltier-node\n            type: DirectoryOrCreate\n        - name: cluster-key", "              drop: [\"ALL\"]\n              add: [\"KILL\"]\n      volumes:\n        - name: tier\n          hostPath:\n            path: /dev/shm/cxltier-node\n            type: DirectoryOrCreate\n        - name: cluster-key", "adds capability KILL"},
		{"an uplink as root", "        runAsUser: 65532\n", "        runAsUser: 0\n", "an uplink running as root"},
		{"an uplink as root by default", "        runAsUser: 65532\n", "", "an uplink running as root"},
		{"an uplink outside the tier's group", "        runAsGroup: 2300\n", "        runAsGroup: 2301\n", "not in the tier's group"},
		{"an uplink naming no shared group", "            - name: CXLTIER_SHARED_GROUP # the tier's group, which this pod runs as\n              value: \"2300\"\n", "", "not in the tier's group"},
		{"a daemon outside the group it gives the tier to", "        supplementalGroups: [2300]", "        supplementalGroups: [2301]", "which it is not in"},
		{"listening pods without a NetworkPolicy", "      app.kubernetes.io/component: uplink\n  policyTypes", "      app.kubernetes.io/component: uplinks\n  policyTypes", "no NetworkPolicy of this file guards"},
		{"a NetworkPolicy of no pod", "      app.kubernetes.io/component: uplink\n  policyTypes", "      app.kubernetes.io/component: uplinks\n  policyTypes", "selects no pod of this file"},
		{"a NetworkPolicy for egress only", "  policyTypes: [\"Ingress\"]", "  policyTypes: [\"Egress\"]", "no NetworkPolicy of this file guards"},
		{"an ingress rule that admits everything", "    - ports:\n        - port: metrics\n", "    - {}\n", "admits everything"},
		{"privilege with no device", "            allowPrivilegeEscalation: false\n            readOnlyRootFilesystem: true\n            capabilities:\n              drop: [\"ALL\"]\n      volumes:", "            privileged: true\n      volumes:", "privileged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(string(good), tc.old) {
				t.Fatalf("the manifest no longer holds %q", tc.old)
			}
			bad := strings.Replace(string(good), tc.old, tc.new, 1)
			objs, err := Decode([]byte(bad))
			var msgs []string
			if err != nil {
				msgs = append(msgs, err.Error())
			} else {
				for _, e := range Check(objs) {
					msgs = append(msgs, e.Error())
				}
			}
			if !strings.Contains(strings.Join(msgs, "\n"), tc.want) {
				t.Fatalf("want a refusal saying %q, got %q", tc.want, msgs)
			}
		})
	}
}

// TestCrossRefusals: the checks across files refuse a master's
// NetworkPolicy that keeps the uplinks out, and a peer no manifest runs.
func TestCrossRefusals(t *testing.T) {
	files, err := filepath.Glob("../kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, file, old, new, want string }{
		{"the master closed to the uplinks", "mooncake-master.yaml", "              cxltier/uplink: \"true\"", "              cxltier/uplink: \"yes\"", "keeps out DaemonSet \"cxltier-uplink\""},
		{"a peer no manifest runs", "mooncake-master.yaml", "              cxltier/uplink: \"true\"", "              cxltier/uplink: \"yes\"", "which no manifest runs"},
		{"a server that does not trust the uplinks", "sglang-example.yaml", "            - name: CXLTIER_SHARED_GROUP\n              value: \"2300\"\n", "", "refuses their sockets"},
		{"a DAX uplink the master keeps out", "cxltier-node-dax.yaml", "        cxltier/uplink: \"true\" # what the NetworkPolicies let in", "", "keeps out DaemonSet \"cxltier-uplink-dax\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all := map[string][]Object{}
			for _, f := range files {
				raw, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if filepath.Base(f) == tc.file {
					if !strings.Contains(string(raw), tc.old) {
						t.Fatalf("%s no longer holds %q", f, tc.old)
					}
					raw = []byte(strings.Replace(string(raw), tc.old, tc.new, 1))
				}
				if all[f], err = Decode(raw); err != nil {
					t.Fatal(err)
				}
			}
			var msgs []string
			for _, e := range CrossCheck(all) {
				msgs = append(msgs, e.Error())
			}
			if !strings.Contains(strings.Join(msgs, "\n"), tc.want) {
				t.Fatalf("want a refusal saying %q, got %q", tc.want, msgs)
			}
		})
	}
}

// TestDaemonConfigIsTheDaemons: the ConfigMap's cxltierd.json is a
// configuration cxltierd itself accepts (cxltierd -check-config, built from
// this checkout): its keys are the daemon's flag names, its values parse.
func TestDaemonConfigIsTheDaemons(t *testing.T) {
	for _, f := range []string{"../kubernetes/cxltier-node.yaml", "../kubernetes/cxltier-node-dax.yaml"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, o := range objs {
			cm, ok := o.Obj.(*corev1.ConfigMap)
			if !ok || cm.Data["cxltierd.json"] == "" {
				continue
			}
			found = true
			if err := checkDaemonConfig(t, cm.Data["cxltierd.json"]); err != nil {
				t.Errorf("%s: cxltierd.json: %v", f, err)
			}
		}
		if !found {
			t.Errorf("%s: no cxltierd.json", f)
		}
	}
}

// checkDaemonConfig runs this checkout's cxltierd -check-config on conf.
func checkDaemonConfig(t *testing.T, conf string) error {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build cxltierd with")
	}
	f := filepath.Join(t.TempDir(), "cxltierd.json")
	if err := os.WriteFile(f, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "./cmd/cxltierd", "-config", f, "-check-config")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "configuration ok") {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}
