// Command judge runs kube-scheduler's own framework (the in-tree plugin registry, a KubeSchedulerConfiguration
// loaded and defaulted exactly as kube-scheduler loads its --config) over a cluster snapshot, and prints for each
// incoming pod, per node and per plugin, what kube-scheduler's plugins decide: PreFilter and Filter status code
// and reasons, raw and normalised scores, weights and the weighted total. crane-scheduler's differential tests
// use it as the reference for the built-in plugins (tests/differential).
//
// Two ways to run it:
//
//	judge --config sched.yaml --snapshot cluster.json        # one request from a file, pretty JSON out
//	judge --serve                                            # JSON lines: one request per stdin line
//	judge --kubeconfig ~/.kube/config [--pod ns/name]        # nodes and pods read from a real API server
//
// A request is {"id", "config", "profile", "nodes", "pods", "incoming"}: config is a KubeSchedulerConfiguration
// (a JSON object or a YAML/JSON string; absent = kube-scheduler's defaults), profile a schedulerName (default: the
// incoming pod's, else the first profile), nodes the v1.Node objects, pods the assigned pods (spec.nodeName set)
// counted on their nodes, incoming the pods to evaluate. Incoming pods are evaluated independently against the
// same snapshot (nothing is assumed). The answer is {"id", "results": [...]} or {"id", "error"}.
//
// Optional: "pvcs", "pvs", "storageClasses", "csiNodes", "csiDrivers", "csiStorageCapacities",
// "volumeAttachments", "pdbs", "resourceClaims", "resourceSlices", "deviceClasses", "deviceTaintRules" are served
// to the plugins' listers (VolumeBinding, VolumeRestrictions, VolumeZone, NodeVolumeLimits, DefaultPreemption,
// DynamicResources: kube-scheduler's DRA manager over them, its slice tracker applying the DeviceTaintRules as
// kube-scheduler's does with DRADeviceTaintRules on) from a fake clientset made for the request; a node DynamicResources
// lets through also gets "dra": the allocation results the plugin's Reserve signals for the incoming pod's claims
// on that node (kube's allocator's first solution). With "preempt": true, an
// incoming pod no node fits also gets "preemption": DefaultPreemption's message, or its dry-run candidates (node,
// victims, PDB violations) and the ones pickOneNodeForPreemption may choose.
//
// Unlike kube-scheduler, the judge does not stop at a node's first failing Filter plugin: "filter" holds every
// plugin's own verdict on every node (its PreFilter state permitting), while "status" is the framework's verdict
// (first failure, PreFilterResult restrictions applied), and only the framework's feasible nodes are scored. All
// nodes are evaluated (no percentageOfNodesToScore sampling) and every feasible node is scored, even when only one
// is feasible (kube-scheduler skips scoring then).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultpreemption"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodevolumelimits"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	schedutil "k8s.io/kubernetes/pkg/scheduler/util"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"
)

// ---------------------------------------------------------------------------------------------- wire types

type request struct {
	ID       json.RawMessage `json:"id,omitempty"`
	Config   json.RawMessage `json:"config,omitempty"`
	Profile  string          `json:"profile,omitempty"`
	Nodes    []*v1.Node      `json:"nodes"`
	Pods     []*v1.Pod       `json:"pods"`
	Incoming []*v1.Pod       `json:"incoming"`
	// The API objects the volume plugins and preemption read through their listers. A request with any of them
	// gets frameworks of its own, built on a fake clientset holding them (and the nodes and pods).
	PVCs                 []*v1.PersistentVolumeClaim     `json:"pvcs,omitempty"`
	PVs                  []*v1.PersistentVolume          `json:"pvs,omitempty"`
	StorageClasses       []*storagev1.StorageClass       `json:"storageClasses,omitempty"`
	CSINodes             []*storagev1.CSINode            `json:"csiNodes,omitempty"`
	CSIDrivers           []*storagev1.CSIDriver          `json:"csiDrivers,omitempty"`
	CSIStorageCapacities []*storagev1.CSIStorageCapacity `json:"csiStorageCapacities,omitempty"`
	VolumeAttachments    []*storagev1.VolumeAttachment   `json:"volumeAttachments,omitempty"`
	PDBs                 []*policyv1.PodDisruptionBudget `json:"pdbs,omitempty"`
	ResourceClaims       []*resourceapi.ResourceClaim    `json:"resourceClaims,omitempty"`
	ResourceSlices       []*resourceapi.ResourceSlice    `json:"resourceSlices,omitempty"`
	DeviceClasses        []*resourceapi.DeviceClass      `json:"deviceClasses,omitempty"`
	DeviceTaintRules     []*resourceapi.DeviceTaintRule  `json:"deviceTaintRules,omitempty"`
	// Preempt: for an incoming pod no node fits, also run DefaultPreemption's decision (eligibility, the
	// evaluator's dry run on every potential node, the candidates pickOneNodeForPreemption may choose).
	Preempt bool `json:"preempt,omitempty"`
}

func (r *request) objects() []runtime.Object {
	var out []runtime.Object
	out = appendObjects(out, r.PVCs)
	out = appendObjects(out, r.PVs)
	out = appendObjects(out, r.StorageClasses)
	out = appendObjects(out, r.CSINodes)
	out = appendObjects(out, r.CSIDrivers)
	out = appendObjects(out, r.CSIStorageCapacities)
	out = appendObjects(out, r.VolumeAttachments)
	out = appendObjects(out, r.ResourceClaims)
	out = appendObjects(out, r.ResourceSlices)
	out = appendObjects(out, r.DeviceClasses)
	out = appendObjects(out, r.DeviceTaintRules)
	return appendObjects(out, r.PDBs)
}

func appendObjects[T runtime.Object](out []runtime.Object, items []T) []runtime.Object {
	for _, o := range items {
		out = append(out, o)
	}
	return out
}

type response struct {
	ID      json.RawMessage `json:"id,omitempty"`
	Results []podResult     `json:"results,omitempty"`
	Error   string          `json:"error,omitempty"`
}

type status struct {
	Code    string   `json:"code"`
	Reasons []string `json:"reasons,omitempty"`
	Plugin  string   `json:"plugin,omitempty"`
}

type preFilterVerdict struct {
	status
	// NodeNames is the plugin's PreFilterResult (nil: all nodes).
	NodeNames []string `json:"nodeNames,omitempty"`
}

type pluginRef struct {
	Name   string `json:"name"`
	Weight int32  `json:"weight,omitempty"`
}

type pluginScore struct {
	Raw        int64 `json:"raw"`
	Normalized int64 `json:"normalized"`
	Weight     int64 `json:"weight"`
	Weighted   int64 `json:"weighted"`
}

type nodeResult struct {
	Name string `json:"name"`
	// Filter is every Filter plugin's own verdict on this node (absent: the plugin was skipped by its PreFilter).
	Filter map[string]status `json:"filter"`
	// Status is the framework's verdict: Success, or the first rejecting plugin (kube-scheduler's NodeToStatus).
	Status   status                 `json:"status"`
	Feasible bool                   `json:"feasible"`
	Scores   map[string]pluginScore `json:"scores,omitempty"`
	Total    *int64                 `json:"total,omitempty"`
	// DRA is what DynamicResources' Reserve would allocate on this feasible node, per claim to allocate.
	DRA []resourceapi.AllocationResult `json:"dra,omitempty"`
}

type podResult struct {
	Pod     string `json:"pod"`
	Profile string `json:"profile"`
	// Plugins lists the enabled plugins per extension point (score: with weights), in the framework's order.
	Plugins   map[string][]pluginRef      `json:"plugins"`
	PreFilter map[string]preFilterVerdict `json:"preFilter"`
	// PreFilterStatus is the framework's combined PreFilter outcome (kube-scheduler's RunPreFilterPlugins).
	PreFilterStatus status            `json:"preFilterStatus"`
	PreScore        map[string]status `json:"preScore,omitempty"`
	Nodes           []nodeResult      `json:"nodes"`
	Feasible        int               `json:"feasible"`
	// Best are the feasible nodes with the highest total score (kube-scheduler picks one of them at random).
	Best []string `json:"best"`
	// ScoreError is set when a PreScore plugin failed: kube-scheduler fails the attempt with it (no node chosen).
	ScoreError string `json:"scoreError,omitempty"`
	// FilterError is set when a Filter plugin failed on a node (kube's Error status, not a rejection):
	// kube-scheduler fails the attempt with it; the first such node in the request's order is reported.
	FilterError string `json:"filterError,omitempty"`
	// Message is kube-scheduler's FitError message when no node is feasible.
	Message string `json:"message,omitempty"`
	// Preemption is DefaultPreemption's answer (request.preempt, no feasible node).
	Preemption *preemptionResult `json:"preemption,omitempty"`
}

type preemptionCandidate struct {
	Node string `json:"node"`
	// Victims as namespace/name, most important first (kube's order).
	Victims       []string `json:"victims"`
	PDBViolations int64    `json:"pdbViolations"`
}

type preemptionResult struct {
	// Message is the PostFilter status message ("preemption: ..."); empty when a candidate is nominated.
	Message    string                `json:"message,omitempty"`
	Candidates []preemptionCandidate `json:"candidates"`
	// Best are the candidates pickOneNodeForPreemption may return: its criteria tie between them (kube takes the
	// first in map order, i.e. at random).
	Best []string `json:"best"`
}

// noNominator: the judge's snapshots have no nominated pods (the framework needs a PodNominator for
// RunFilterPluginsWithNominatedPods, which preemption's dry run calls).
type noNominator struct{}

func (noNominator) AddNominatedPod(klog.Logger, fwk.PodInfo, *fwk.NominatingInfo) {}
func (noNominator) DeleteNominatedPodIfExists(*v1.Pod)                            {}
func (noNominator) UpdateNominatedPod(klog.Logger, *v1.Pod, fwk.PodInfo)          {}
func (noNominator) NominatedPodsForNode(string) []fwk.PodInfo                     { return nil }

// ---------------------------------------------------------------------------------------------- frameworks

// swappableLister lets one framework (built once per configuration) look at a new snapshot per request: every
// SharedLister method (nodes, storage, and since 1.37 the pod groups) is the current snapshot's.
type swappableLister struct{ *internalcache.Snapshot }

type profileFramework struct {
	fw      framework.Framework
	plugins map[string]fwk.Plugin // the instances the framework runs, captured from the registry's factories
	lister  *swappableLister
	claims  *recordingClaims // DynamicResources' claim tracker, recording Reserve's allocations
}

// recordingClaims is kube-scheduler's claim tracker, remembering the claims Reserve signals as pending (their
// status.allocation is the allocator's result for the chosen node).
type recordingClaims struct {
	fwk.ResourceClaimTracker
	mu      sync.Mutex
	pending []*resourceapi.ResourceClaim
}

func (r *recordingClaims) SignalClaimPendingAllocation(uid types.UID, claim *resourceapi.ResourceClaim) error {
	r.mu.Lock()
	r.pending = append(r.pending, claim)
	r.mu.Unlock()
	return r.ResourceClaimTracker.SignalClaimPendingAllocation(uid, claim)
}

func (r *recordingClaims) take() []*resourceapi.ResourceClaim {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.pending
	r.pending = nil
	return out
}

type recordingDRAManager struct {
	fwk.SharedDRAManager
	claims *recordingClaims
}

func (m recordingDRAManager) ResourceClaims() fwk.ResourceClaimTracker { return m.claims }

type judge struct {
	ctx    context.Context
	client clientset.Interface
	mu     sync.Mutex
	cache  map[string]map[string]*profileFramework // config text -> schedulerName -> framework
	order  map[string][]string                     // config text -> profile names in config order
}

func newJudge(ctx context.Context, client clientset.Interface) *judge {
	return &judge{ctx: ctx, client: client, cache: map[string]map[string]*profileFramework{}, order: map[string][]string{}}
}

// loadConfig decodes a KubeSchedulerConfiguration the way kube-scheduler's --config does (the scheme's
// UniversalDecoder applies the v1 defaults: default plugins merged into multiPoint, default plugin args), then
// validates it.
func loadConfig(raw []byte) (*config.KubeSchedulerConfiguration, error) {
	text := strings.TrimSpace(string(raw))
	if text == "" || text == "null" {
		text = `{"apiVersion":"kubescheduler.config.k8s.io/v1","kind":"KubeSchedulerConfiguration"}`
	}
	if strings.HasPrefix(text, `"`) { // a YAML or JSON document given as a JSON string
		var s string
		if err := json.Unmarshal([]byte(text), &s); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		text = s
	}
	obj, gvk, err := scheme.Codecs.UniversalDecoder().Decode([]byte(text), nil, nil)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cfg, ok := obj.(*config.KubeSchedulerConfiguration)
	if !ok {
		return nil, fmt.Errorf("config: expected a KubeSchedulerConfiguration, got %s", gvk)
	}
	cfg.TypeMeta.APIVersion = gvk.GroupVersion().String()
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return cfg, nil
}

func (j *judge) frameworks(raw []byte) (map[string]*profileFramework, []string, error) {
	key := string(raw)
	j.mu.Lock()
	defer j.mu.Unlock()
	if fws, ok := j.cache[key]; ok {
		return fws, j.order[key], nil
	}
	fws, names, err := j.build(j.ctx, raw, j.client)
	if err != nil {
		return nil, nil, err
	}
	if len(j.cache) > 64 { // many distinct configurations: keep memory bounded
		j.cache, j.order = map[string]map[string]*profileFramework{}, map[string][]string{}
	}
	j.cache[key], j.order[key] = fws, names
	return fws, names, nil
}

// build makes one framework per profile of the configuration, its informers on client (started and synced).
func (j *judge) build(ctx context.Context, raw []byte, client clientset.Interface) (map[string]*profileFramework, []string, error) {
	cfg, err := loadConfig(raw)
	if err != nil {
		return nil, nil, err
	}
	fws := map[string]*profileFramework{}
	var names []string
	for i := range cfg.Profiles {
		prof := &cfg.Profiles[i]
		pf := &profileFramework{plugins: map[string]fwk.Plugin{}, lister: &swappableLister{internalcache.NewEmptySnapshot()}}
		registry := frameworkruntime.Registry{}
		for name, factory := range plugins.NewInTreeRegistry() {
			registry[name] = func(ctx context.Context, args runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
				p, err := factory(ctx, args, h)
				if err == nil {
					pf.plugins[name] = p
				}
				return p, err
			}
		}
		informerFactory := informers.NewSharedInformerFactory(client, 0)
		// kube-scheduler's DRA manager (scheduler.New): the claims' assume cache and the slice tracker.
		logger := klog.FromContext(ctx)
		claimCache := assumecache.NewAssumeCache(logger, informerFactory.Resource().V1().ResourceClaims().Informer(), "ResourceClaim", "", nil)
		// The tracker as scheduler.New makes it: with DRADeviceTaintRules (GA, on in 1.37) it applies the
		// DeviceTaintRules to the slices the allocator sees.
		trackerOpts := tracker.Options{
			EnableDeviceTaintRules:   utilfeature.DefaultFeatureGate.Enabled(features.DRADeviceTaintRules),
			EnableConsumableCapacity: utilfeature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity),
			SliceInformer:            informerFactory.Resource().V1().ResourceSlices(),
			KubeClient:               client,
		}
		if trackerOpts.EnableDeviceTaintRules {
			trackerOpts.TaintInformer = informerFactory.Resource().V1().DeviceTaintRules()
		}
		slices, err := tracker.StartTracker(ctx, trackerOpts)
		if err != nil {
			return nil, nil, err
		}
		dra := dynamicresources.NewDRAManager(ctx, claimCache, slices, informerFactory)
		pf.claims = &recordingClaims{ResourceClaimTracker: dra.ResourceClaims()}
		// The claims' assume cache is a handler of its own on the claims informer: wait for it too (a handler of
		// ours on the informer says nothing of another handler's progress), or a PreFilter may list no claims.
		draSynced := []toolscache.InformerSynced{claimCache.AddEventHandler(toolscache.ResourceEventHandlerFuncs{}).HasSynced}
		// kube-scheduler's event handlers feed the DeviceClasses to the DRA manager's extended resource cache
		// (DRAExtendedResource, GA in 1.37): the class an extended resource name maps to.
		if erCache, ok := dra.DeviceClassResolver().(*extendedresourcecache.ExtendedResourceCache); ok && erCache != nil {
			reg, err := informerFactory.Resource().V1().DeviceClasses().Informer().AddEventHandler(erCache)
			if err != nil {
				return nil, nil, err
			}
			draSynced = append(draSynced, reg.HasSynced)
		}
		fw, err := frameworkruntime.NewFramework(ctx, registry, prof,
			frameworkruntime.WithSharedDRAManager(recordingDRAManager{dra, pf.claims}),
			frameworkruntime.WithClientSet(client),
			frameworkruntime.WithInformerFactory(informerFactory),
			frameworkruntime.WithSnapshotSharedLister(pf.lister),
			// 1.37's DefaultPreemption reads the nodes (and pod groups) through the mutable lister
			frameworkruntime.WithMutableSnapshotLister(pf.lister),
			frameworkruntime.WithParallelism(int(cfg.Parallelism)),
			frameworkruntime.WithPodNominator(noNominator{}),
			frameworkruntime.WithSharedCSIManager(nodevolumelimits.NewCSIManager(informerFactory.Storage().V1().CSINodes().Lister())),
		)
		if err != nil {
			return nil, nil, fmt.Errorf("profile %q: %w", prof.SchedulerName, err)
		}
		// VolumeBinding's assume caches are informer event handlers: a handler of ours, registered after
		// theirs, is synced once every listed object has been handed to every handler.
		var synced []toolscache.InformerSynced
		for _, inf := range []toolscache.SharedIndexInformer{
			informerFactory.Core().V1().PersistentVolumes().Informer(),
			informerFactory.Core().V1().PersistentVolumeClaims().Informer(),
			informerFactory.Resource().V1().ResourceClaims().Informer(),
			informerFactory.Resource().V1().ResourceSlices().Informer(),
			informerFactory.Resource().V1().DeviceClasses().Informer(),
		} {
			reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{})
			if err != nil {
				return nil, nil, err
			}
			synced = append(synced, reg.HasSynced)
		}
		informerFactory.Start(ctx.Done())
		informerFactory.WaitForCacheSync(ctx.Done())
		toolscache.WaitForCacheSync(ctx.Done(), append(append(synced, draSynced...), slices.HasSynced)...)
		pf.fw = fw
		fws[prof.SchedulerName] = pf
		names = append(names, prof.SchedulerName)
	}
	return fws, names, nil
}

// ---------------------------------------------------------------------------------------------- evaluation

func toStatus(s *fwk.Status) status {
	if s == nil { // nil means Success in the framework
		return status{Code: fwk.Success.String()}
	}
	out := status{Code: s.Code().String(), Reasons: s.Reasons(), Plugin: s.Plugin()}
	if s.AsError() != nil && len(out.Reasons) == 0 {
		out.Reasons = []string{s.AsError().Error()}
	}
	return out
}

func (j *judge) handle(req *request) ([]podResult, error) {
	var fws map[string]*profileFramework
	var names []string
	var err error
	if objs := req.objects(); len(objs) > 0 {
		objs = appendObjects(appendObjects(objs, req.Nodes), req.Pods)
		ctx, cancel := context.WithCancel(j.ctx)
		defer cancel() // stops this request's informers
		fws, names, err = j.build(ctx, req.Config, fake.NewClientset(objs...))
	} else {
		fws, names, err = j.frameworks(req.Config)
	}
	if err != nil {
		return nil, err
	}
	seen := sets.New[string]()
	for i, n := range req.Nodes {
		if n == nil || n.Name == "" {
			return nil, fmt.Errorf("nodes[%d]: metadata.name is required", i)
		}
		if seen.Has(n.Name) {
			return nil, fmt.Errorf("nodes[%d]: duplicate node %q", i, n.Name)
		}
		seen.Insert(n.Name)
	}
	for i, p := range req.Pods {
		if p == nil || p.Spec.NodeName == "" {
			return nil, fmt.Errorf("pods[%d]: spec.nodeName is required (pods are the assigned pods)", i)
		}
	}
	snap := internalcache.NewSnapshot(req.Pods, req.Nodes)
	out := make([]podResult, 0, len(req.Incoming))
	for i, pod := range req.Incoming {
		if pod == nil {
			return nil, fmt.Errorf("incoming[%d]: null pod", i)
		}
		name := req.Profile
		if name == "" {
			name = pod.Spec.SchedulerName
			if _, ok := fws[name]; !ok {
				name = names[0]
			}
		}
		pf, ok := fws[name]
		if !ok {
			return nil, fmt.Errorf("profile %q is not in the configuration (profiles: %s)", name, strings.Join(names, ", "))
		}
		pf.lister.Snapshot = snap
		res, err := j.evaluate(pf, req, pod)
		if err != nil {
			return nil, fmt.Errorf("incoming[%d] %s/%s: %w", i, pod.Namespace, pod.Name, err)
		}
		res.Profile = name
		out = append(out, res)
	}
	return out, nil
}

func (j *judge) evaluate(pf *profileFramework, req *request, pod *v1.Pod) (res podResult, err error) {
	ctx := j.ctx
	nodes := req.Nodes
	fw := pf.fw
	listed := fw.ListPlugins()
	res = podResult{
		Pod:       pod.Namespace + "/" + pod.Name,
		Plugins:   map[string][]pluginRef{},
		PreFilter: map[string]preFilterVerdict{},
		Nodes:     make([]nodeResult, 0, len(nodes)),
		Best:      []string{},
	}
	for point, set := range map[string]config.PluginSet{
		"preFilter": listed.PreFilter, "filter": listed.Filter, "preScore": listed.PreScore, "score": listed.Score,
	} {
		refs := []pluginRef{}
		for _, p := range set.Enabled {
			refs = append(refs, pluginRef{p.Name, p.Weight})
		}
		res.Plugins[point] = refs
	}
	allNodes, err := pf.lister.NodeInfos().List()
	if err != nil {
		return res, err
	}
	byName := map[string]fwk.NodeInfo{}
	for _, ni := range allNodes {
		byName[ni.Node().Name] = ni
	}

	// Every plugin on its own: each PreFilter, then each Filter on every node (a separate cycle state, so the
	// framework's own run below is untouched by these extra calls).
	solo := framework.NewCycleState()
	filterable := sets.New[string]()
	for _, ref := range listed.PreFilter.Enabled {
		pl := pf.plugins[ref.Name].(fwk.PreFilterPlugin)
		r, s := pl.PreFilter(ctx, solo, pod, allNodes)
		v := preFilterVerdict{status: toStatus(s)}
		if !r.AllNodes() {
			v.NodeNames = sets.List(r.NodeNames)
			if v.NodeNames == nil {
				v.NodeNames = []string{}
			}
		}
		res.PreFilter[ref.Name] = v
		if s.IsSuccess() {
			filterable.Insert(ref.Name)
		}
	}
	preFilters := sets.New[string]()
	for _, ref := range listed.PreFilter.Enabled {
		preFilters.Insert(ref.Name)
	}

	// The framework's run: kube-scheduler's findNodesThatFitPod without sampling or nominated nodes.
	state := framework.NewCycleState()
	// DynamicResources' Reserve (what it would allocate) runs per feasible node once everything else is done: since
	// 1.37 it leaves the allocation in the cycle state (a pending allocation for the pod's group), which a later
	// Filter or Score in the same state would take as already made.
	var draNodes []int
	defer func() {
		for _, i := range draNodes {
			res.Nodes[i].DRA = draAllocation(ctx, pf, state, pod, res.Nodes[i].Name)
		}
	}()
	preRes, preStatus, restricting := fw.RunPreFilterPlugins(ctx, state, pod)
	res.PreFilterStatus = toStatus(preStatus)
	diagnosis := framework.Diagnosis{NodeToStatus: framework.NewDefaultNodeToStatus()}
	var feasible []fwk.NodeInfo
	if !preStatus.IsSuccess() {
		if !preStatus.IsRejected() {
			return res, preStatus.AsError()
		}
		diagnosis.NodeToStatus.SetAbsentNodesStatus(preStatus)
		diagnosis.PreFilterMsg = preStatus.Message()
	} else if !preRes.AllNodes() {
		diagnosis.NodeToStatus.SetAbsentNodesStatus(fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			fmt.Sprintf("node(s) didn't satisfy plugin(s) %v", sets.List(restricting))))
	}
	for _, node := range nodes {
		ni := byName[node.Name]
		nr := nodeResult{Name: node.Name, Filter: map[string]status{}}
		for _, ref := range listed.Filter.Enabled {
			if preFilters.Has(ref.Name) && !filterable.Has(ref.Name) {
				continue // skipped (or rejected) by its own PreFilter: its Filter does not run
			}
			pl := pf.plugins[ref.Name].(fwk.FilterPlugin)
			nr.Filter[ref.Name] = toStatus(pl.Filter(ctx, solo, pod, ni))
		}
		switch {
		case !preStatus.IsSuccess():
			nr.Status = toStatus(preStatus)
		case !preRes.AllNodes() && !preRes.NodeNames.Has(node.Name):
			nr.Status = toStatus(diagnosis.NodeToStatus.AbsentNodesStatus())
		default:
			s := fw.RunFilterPlugins(ctx, state, pod, ni)
			nr.Status = toStatus(s)
			if s.IsSuccess() {
				nr.Feasible = true
				feasible = append(feasible, ni)
				draNodes = append(draNodes, len(res.Nodes))
			} else if s.IsRejected() {
				diagnosis.NodeToStatus.Set(node.Name, s)
			} else if res.FilterError == "" {
				res.FilterError = s.AsError().Error()
			}
		}
		res.Nodes = append(res.Nodes, nr)
	}
	res.Feasible = len(feasible)
	if res.FilterError != "" {
		return res, nil
	}
	if len(feasible) == 0 {
		res.Message = (&framework.FitError{Pod: pod, NumAllNodes: len(allNodes), Diagnosis: diagnosis}).Error()
		if req.Preempt {
			if dp, ok := pf.plugins[defaultpreemption.Name].(*defaultpreemption.DefaultPreemption); ok {
				p, err := preempt(ctx, dp, state, pod, allNodes, pf.lister, diagnosis, req.PDBs)
				if err != nil {
					return res, fmt.Errorf("preemption: %w", err)
				}
				res.Preemption = p
			}
		}
		return res, nil
	}

	// Score the feasible nodes: the framework's PreScore decides which Score plugins run (Skip), then each Score
	// plugin's raw scores, its NormalizeScore, and the framework's weighted totals.
	if s := fw.RunPreScorePlugins(ctx, state, pod, feasible); !s.IsSuccess() {
		// kube-scheduler fails the attempt with this error (e.g. an invalid preferred node affinity term).
		res.ScoreError = s.AsError().Error()
		return res, nil
	}
	skipped := state.GetSkipScorePlugins()
	res.PreScore = map[string]status{}
	for _, ref := range listed.PreScore.Enabled {
		code := "Success"
		if skipped.Has(ref.Name) {
			code = "Skip"
		}
		res.PreScore[ref.Name] = status{Code: code}
	}
	index := map[string]int{}
	for i := range res.Nodes {
		if res.Nodes[i].Feasible {
			index[res.Nodes[i].Name] = i
			res.Nodes[i].Scores = map[string]pluginScore{}
		}
	}
	for _, ref := range listed.Score.Enabled {
		if skipped.Has(ref.Name) {
			continue
		}
		pl := pf.plugins[ref.Name].(fwk.ScorePlugin)
		list := make(fwk.NodeScoreList, len(feasible))
		raw := make([]int64, len(feasible))
		for k, ni := range feasible {
			sc, s := pl.Score(ctx, state, pod, ni)
			if !s.IsSuccess() { // kube-scheduler fails the attempt (DynamicResources' computeScore can)
				res.ScoreError = fmt.Sprintf("running Score plugin %q: %v", ref.Name, s.AsError())
				return res, nil
			}
			list[k] = fwk.NodeScore{Name: ni.Node().Name, Score: sc}
			raw[k] = sc
		}
		if ext := pl.ScoreExtensions(); ext != nil {
			if s := ext.NormalizeScore(ctx, state, pod, list); !s.IsSuccess() {
				return res, fmt.Errorf("normalize %s: %w", ref.Name, s.AsError())
			}
		}
		for k, ns := range list {
			w := int64(ref.Weight)
			res.Nodes[index[ns.Name]].Scores[ref.Name] = pluginScore{Raw: raw[k], Normalized: ns.Score, Weight: w, Weighted: ns.Score * w}
		}
	}
	totals, s := fw.RunScorePlugins(ctx, state, pod, feasible)
	if !s.IsSuccess() {
		return res, s.AsError()
	}
	best := int64(-1)
	for _, t := range totals {
		total := t.TotalScore
		res.Nodes[index[t.Name]].Total = &total
		var sum int64
		for _, ps := range res.Nodes[index[t.Name]].Scores {
			sum += ps.Weighted
		}
		if sum != total { // the per-plugin calls above must reproduce the framework's own run
			return res, fmt.Errorf("node %s: per-plugin weighted scores sum to %d, framework total %d", t.Name, sum, total)
		}
		if total > best {
			best, res.Best = total, nil
		}
		if total == best {
			res.Best = append(res.Best, t.Name)
		}
	}
	sort.Strings(res.Best)
	return res, nil
}

// preempt is DefaultPreemption's PostFilter (Evaluator.Preempt) up to the choice, without its API calls: the
// eligibility check, the dry run on every potential node (offset 0; kube's random offset only changes which
// candidates are found when fewer than all are wanted), and every candidate the choice can return.
func preempt(ctx context.Context, dp *defaultpreemption.DefaultPreemption, state fwk.CycleState, pod *v1.Pod,
	allNodes []fwk.NodeInfo, lister *swappableLister, diagnosis framework.Diagnosis, pdbs []*policyv1.PodDisruptionBudget) (*preemptionResult, error) {
	out := &preemptionResult{Candidates: []preemptionCandidate{}, Best: []string{}}
	if ok, msg := dp.PodEligibleToPreemptOthers(ctx, pod, diagnosis.NodeToStatus.Get(pod.Status.NominatedNodeName)); !ok {
		out.Message = "preemption: " + msg
		return out, nil
	}
	potential, err := diagnosis.NodeToStatus.NodesForStatusCode(lister.NodeInfos(), fwk.Unschedulable)
	if err != nil {
		return nil, err
	}
	statuses := framework.NewDefaultNodeToStatus()
	var candidates []interface {
		Victims() *extenderv1.Victims
		Name() string
	}
	if len(potential) > 0 {
		_, num := dp.GetOffsetAndNumCandidates(int32(len(potential)))
		found, st, err := dp.Evaluator.DryRunPreemption(ctx, state, pod, potential, pdbs, 0, num)
		if err != nil && len(found) == 0 {
			return nil, err
		}
		statuses = st
		for _, c := range found {
			candidates = append(candidates, c)
		}
	}
	if len(candidates) == 0 {
		fe := &framework.FitError{Pod: pod, NumAllNodes: len(allNodes), Diagnosis: framework.Diagnosis{NodeToStatus: statuses}}
		fe.Diagnosis.NodeToStatus.SetAbsentNodesStatus(fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "Preemption is not helpful for scheduling"))
		out.Message = "preemption: " + fe.Error()
		return out, nil
	}
	victims := map[string]*extenderv1.Victims{}
	for _, c := range candidates {
		pc := preemptionCandidate{Node: c.Name(), Victims: []string{}, PDBViolations: c.Victims().NumPDBViolations}
		for _, v := range c.Victims().Pods {
			pc.Victims = append(pc.Victims, v.Namespace+"/"+v.Name)
		}
		out.Candidates = append(out.Candidates, pc)
		victims[c.Name()] = c.Victims()
	}
	sort.Slice(out.Candidates, func(a, b int) bool { return out.Candidates[a].Node < out.Candidates[b].Node })
	out.Best = tiedForPreemption(victims)
	return out, nil
}

// tiedForPreemption is pickOneNodeForPreemption's criteria (kube's default score functions, in its order) without
// its last step: every node still tied, sorted.
func tiedForPreemption(nodesToVictims map[string]*extenderv1.Victims) []string {
	scoreFuncs := []func(string) int64{
		func(node string) int64 { return -nodesToVictims[node].NumPDBViolations },
		func(node string) int64 { return -int64(corev1helpers.PodPriority(nodesToVictims[node].Pods[0])) },
		func(node string) int64 {
			var sum int64
			for _, p := range nodesToVictims[node].Pods {
				sum += int64(corev1helpers.PodPriority(p)) + int64(math.MaxInt32+1)
			}
			return -sum
		},
		func(node string) int64 { return -int64(len(nodesToVictims[node].Pods)) },
		func(node string) int64 {
			earliest := schedutil.GetEarliestPodStartTime(nodesToVictims[node])
			if earliest == nil {
				return math.MinInt64
			}
			return earliest.UnixNano()
		},
	}
	var all []string
	for node := range nodesToVictims {
		all = append(all, node)
	}
	for _, f := range scoreFuncs {
		best := int64(math.MinInt64)
		var kept []string
		for _, node := range all {
			score := f(node)
			if score > best {
				best, kept = score, nil
			}
			if score == best {
				kept = append(kept, node)
			}
		}
		all = kept
		if len(all) == 1 {
			break
		}
	}
	sort.Strings(all)
	return all
}

// ---------------------------------------------------------------------------------------------- main

func readFromServer(ctx context.Context, client clientset.Interface, only string) (*request, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	req := &request{}
	for i := range nodes.Items {
		req.Nodes = append(req.Nodes, &nodes.Items[i])
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		switch {
		case only != "" && p.Namespace+"/"+p.Name == only:
			q := p.DeepCopy()
			q.Spec.NodeName = "" // explain it as if it were pending (it is not counted on its node either)
			req.Incoming = append(req.Incoming, q)
		case p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed:
		case p.Spec.NodeName != "":
			req.Pods = append(req.Pods, p)
		case only == "":
			req.Incoming = append(req.Incoming, p)
		}
	}
	if only != "" && len(req.Incoming) == 0 {
		return nil, fmt.Errorf("pod %s not found", only)
	}
	return req, nil
}

func run() error {
	configPath := flag.String("config", "", "KubeSchedulerConfiguration file (YAML or JSON); default: kube-scheduler's defaults")
	snapshotPath := flag.String("snapshot", "", "request file: {nodes, pods, incoming[, config, profile]} ('-' = stdin)")
	serve := flag.Bool("serve", false, "answer JSON-line requests on stdin with JSON lines on stdout until EOF")
	kubeconfig := flag.String("kubeconfig", "", "read nodes and pods from this cluster (incoming: its pending pods, or --pod)")
	podName := flag.String("pod", "", "with --kubeconfig: explain only this pod (namespace/name), as if it were pending")
	gates := flag.String("feature-gates", "", "kube feature gates, as kube-scheduler's --feature-gates (A=true,B=false)")
	klog.InitFlags(nil)
	flag.Parse()
	metrics.Register() // the framework records into the scheduler's metrics; unregistered they are nil
	if *gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*gates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}
	var cfg json.RawMessage
	if *configPath != "" {
		data, err := os.ReadFile(*configPath)
		if err != nil {
			return err
		}
		cfg, _ = json.Marshal(string(data))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var client clientset.Interface = fake.NewClientset()
	if *kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
		if client, err = clientset.NewForConfig(rc); err != nil {
			return err
		}
	}
	j := newJudge(ctx, client)
	enc := json.NewEncoder(os.Stdout)

	if *serve {
		in := bufio.NewReaderSize(os.Stdin, 1<<20)
		for {
			line, err := in.ReadBytes('\n')
			if len(strings.TrimSpace(string(line))) > 0 {
				var req request
				var resp response
				if derr := json.Unmarshal(line, &req); derr != nil {
					resp.Error = "request: " + derr.Error()
				} else {
					resp.ID = req.ID
					if req.Config == nil {
						req.Config = cfg
					}
					if resp.Results, derr = j.handle(&req); derr != nil {
						resp.Error = derr.Error()
					}
				}
				if err := enc.Encode(&resp); err != nil {
					return err
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
		}
	}

	var req *request
	switch {
	case *kubeconfig != "":
		var err error
		if req, err = readFromServer(ctx, client, *podName); err != nil {
			return err
		}
	case *snapshotPath != "":
		var data []byte
		var err error
		if *snapshotPath == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(*snapshotPath)
		}
		if err != nil {
			return err
		}
		req = &request{}
		if err := json.Unmarshal(data, req); err != nil {
			return fmt.Errorf("%s: %w", *snapshotPath, err)
		}
	default:
		return errors.New("one of --snapshot, --serve or --kubeconfig is required")
	}
	if req.Config == nil {
		req.Config = cfg
	}
	results, err := j.handle(req)
	if err != nil {
		return err
	}
	enc.SetIndent("", "  ")
	return enc.Encode(response{ID: req.ID, Results: results})
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "judge:", err)
		os.Exit(1)
	}
}

// draAllocation runs DynamicResources' Reserve for the node (its Filter stored the allocator's result in the cycle
// state) and reports the allocations it signals, then Unreserve undoes it.
func draAllocation(ctx context.Context, pf *profileFramework, state fwk.CycleState, pod *v1.Pod, node string) []resourceapi.AllocationResult {
	pl, ok := pf.plugins[dynamicresources.Name].(*dynamicresources.DynamicResources)
	if !ok { // a pod without claims may still get the claim for its extended resources
		return nil
	}
	pf.claims.take()
	if s := pl.Reserve(ctx, state, pod, node); !s.IsSuccess() {
		return nil
	}
	claims := pf.claims.take()
	pl.Unreserve(ctx, state, pod, node)
	out := make([]resourceapi.AllocationResult, 0, len(claims))
	for _, c := range claims {
		if c.Status.Allocation != nil {
			out = append(out, *c.Status.Allocation)
		}
	}
	return out
}
