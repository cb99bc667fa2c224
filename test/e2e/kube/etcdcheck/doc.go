// Command etcdcheck reads brain (or any etcd) directly for the Kubernetes
// end-to-end run (test/e2e/kube/run.sh): member status, one key, the
// compaction kube-apiserver's compactor did, and a key's disappearance.
//
//	etcdcheck -endpoints URL,URL status
//	etcdcheck -endpoints URL get KEY            exit 3 if KEY is absent
//	etcdcheck -endpoints URL count PREFIX
//	etcdcheck -endpoints URL put KEY VALUE      (a write through one member)
//	etcdcheck -endpoints URL compaction         exit 4 if nothing was compacted
//	etcdcheck -endpoints URL wait-gone KEY 90s  exit 5 if KEY is still there
//	etcdcheck -endpoints URL watch PREFIX 60s   prints events and progress
package main
