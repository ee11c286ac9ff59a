package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ShardMapSpec is the desired cluster.
// +kubebuilder:validation:XValidation:rule="(has(self.tls) && has(self.tls.mode) ? self.tls.mode : 'Disabled') == (has(oldSelf.tls) && has(oldSelf.tls.mode) ? oldSelf.tls.mode : 'Disabled')",message="tls.mode cannot change on a running cluster: its pods cannot switch between plain text and TLS one at a time without a split; create a new ShardMap with TLS and move the data (docs/security.md)"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.placement) || self.placement == oldSelf.placement",message="placement is immutable: it is fixed when the cluster is created"
type ShardMapSpec struct {
	// Shards is the number of shards the 16384 slots are split into: a
	// power of two from 1 to 16384. Fixed when the cluster is created.
	// +kubebuilder:default=256
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16384
	// +kubebuilder:validation:XValidation:rule="self in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]",message="shards must be a power of two between 1 and 16384"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="shards is immutable: it is fixed when the cluster is created"
	// +optional
	Shards int32 `json:"shards,omitempty"`

	// Placement is how shards are spread over groups: balanced (fewest
	// moves, equal counts by weight) or consistent-hash. Immutable.
	// +kubebuilder:default=balanced
	// +kubebuilder:validation:Enum=balanced;consistent-hash
	// +optional
	Placement string `json:"placement,omitempty"`

	// Image of the node binary for the whole cluster: the controller
	// group (unless spec.controller.image is set) and every ReplicaGroup
	// that does not set its own spec.image. Unset, the operator's default
	// image, so an operator upgrade that changes its default image rolls
	// the cluster; set, only a change here does. A change rolls the
	// controller group first, then the data groups one at a time, each
	// followers first and its leader last (docs/operator.md, "Upgrades").
	// +optional
	Image string `json:"image,omitempty"`

	// Controller is the shard controller group.
	// +kubebuilder:default={}
	// +optional
	Controller ControllerSpec `json:"controller,omitempty"`

	// Moves pin shards to groups (by ReplicaGroup name), applied with the
	// controller's Move. Removing a pin lets placement move the shard again.
	// +listType=map
	// +listMapKey=shard
	// +kubebuilder:validation:MaxItems=1024
	// +optional
	Moves []ShardMove `json:"moves,omitempty"`

	// Migration tunes how shards are copied between groups.
	// +optional
	Migration MigrationSpec `json:"migration,omitempty"`

	// TLS secures every path into and between the cluster's pods
	// (docs/security.md). Off unless set.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`

	// HTTP guards the pods' HTTP port (8080: /metrics, /status, /debug).
	// +optional
	HTTP HTTPSpec `json:"http,omitempty"`

	// Users names a Secret key holding Redis ACL users, one per line
	// ("user <name> <rules...>", as in Redis's ACL files). The operator
	// keeps the cluster's users the Secret names equal to it (ACL SETUSER
	// users it did not create are left alone) and every node applies
	// them. Passwords are stored as SHA-256 hashes only.
	// +optional
	Users *corev1.SecretKeySelector `json:"users,omitempty"`
	// Network is who may reach the cluster's pods (NetworkPolicies).
	// +kubebuilder:default={}
	// +optional
	Network NetworkSpec `json:"network,omitempty"`

	// Paused stops the operator from changing anything of this cluster
	// (its ReplicaGroups included); status is still updated.
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// HTTPSpec guards the HTTP port of the cluster's pods (docs/security.md).
// With a token or TLS on, only the open paths are served without
// authentication; the rest need the bearer token or (with TLS) an admin
// client certificate.
type HTTPSpec struct {
	// TokenSecret names a Secret key holding the bearer token (node
	// --http-token-file). The pods re-read it when the Secret changes, so
	// a new token needs no restart. Setting or unsetting it rolls the
	// pods.
	// +optional
	TokenSecret *corev1.SecretKeySelector `json:"tokenSecret,omitempty"`
	// OpenPaths are more paths served to anyone, e.g. /metrics for a
	// scraper without the token. /healthz and /readyz are always open:
	// the kubelet's probes carry no token.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Pattern=`^/[A-Za-z0-9/_.-]*$`
	// +optional
	OpenPaths []string `json:"openPaths,omitempty"`
}

// MigrationSpec tunes live shard migration.
type MigrationSpec struct {
	// RateBytesPerSecond caps how fast each data group copies the shards
	// it pulls (the pre-copy snapshot, the deltas and the last copy after
	// the cut-over), in bytes per second per group: every data-group pod
	// runs `node serve --migrate-bytes-per-sec=<n>`. 0 (the default) is
	// unlimited and passes no flag. Changing it rolls the data groups'
	// pods one at a time, like any pod template change.
	// +kubebuilder:validation:Minimum=0
	// +optional
	RateBytesPerSecond int64 `json:"rateBytesPerSecond,omitempty"`
}

// ControllerSpec is the shard controller's Raft group.
type ControllerSpec struct {
	// Replicas of the controller group: odd, so a majority is well defined.
	// A change resizes the running group one member at a time: new pods
	// join as learners and are promoted once caught up; a shrink removes
	// the highest ordinals' members (moving leadership away first), then
	// their pods and volumes.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=7
	// +kubebuilder:validation:XValidation:rule="self % 2 == 1",message="controller replicas must be odd (1, 3, 5 or 7)"
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// Image of the controller's node binary; defaults to spec.image, then
	// the operator's own image.
	// +optional
	Image string `json:"image,omitempty"`
	// +kubebuilder:default=IfNotPresent
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// +kubebuilder:default={}
	// +optional
	Storage StorageSpec `json:"storage,omitempty"`
	// PodTemplate is merged into the controller pods: scheduling
	// (affinity, tolerations, nodeSelector, topology spread, priority
	// class) and annotations. Changing it rolls the controller pods one
	// at a time.
	// +optional
	PodTemplate PodOverrides `json:"podTemplate,omitempty"`
}

// ShardMove pins one shard to a group.
type ShardMove struct {
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16383
	Shard int32 `json:"shard"`
	// Group is the ReplicaGroup's name.
	// +kubebuilder:validation:MinLength=1
	Group string `json:"group"`
}

// ShardMapStatus is the observed cluster.
type ShardMapStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ConfigNum is the latest config of the controller.
	// +optional
	ConfigNum int64 `json:"configNum,omitempty"`
	// +optional
	ControllerReadyReplicas int32 `json:"controllerReadyReplicas,omitempty"`
	// ControllerVoters are the controller group's voting members, as its
	// leader last reported them (a resize moves it one at a time).
	// +optional
	ControllerVoters int32 `json:"controllerVoters,omitempty"`
	// Groups are the groups in the latest config.
	// +optional
	Groups []GroupRef `json:"groups,omitempty"`
	// GroupCount is len(groups), for the printer column.
	// +optional
	GroupCount int32 `json:"groupCount"`
	// Table is the shard table as runs of owner and state.
	// +optional
	Table []ShardRange `json:"table,omitempty"`
	// ShardStates counts shards by state.
	// +optional
	ShardStates map[string]int32 `json:"shardStates,omitempty"`
	// MigratingShards is how many shards are moving.
	// +optional
	MigratingShards int32 `json:"migratingShards"`
	// Migrations in flight, by source and target.
	// +optional
	Migrations []Migration `json:"migrations,omitempty"`
	// NextGroupID is the next group id to assign; ids are never reused.
	// +optional
	NextGroupID int64 `json:"nextGroupID,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// GroupRef is a group of the cluster.
type GroupRef struct {
	Name    string `json:"name"`
	GroupID int64  `json:"groupID"`
	// +optional
	Shards int32 `json:"shards,omitempty"`
	// Leaving: the group left the cluster but still owns shards whose
	// planned moves have not cut over yet.
	// +optional
	Leaving bool `json:"leaving,omitempty"`
	// MigrateBytesPerSec is the copy rate limit the group reports running
	// with (its --migrate-bytes-per-sec; 0: unlimited).
	// +optional
	MigrateBytesPerSec int64 `json:"migrateBytesPerSec,omitempty"`
	// LastWritePause is the write pause of the latest move into this
	// group (of the shards it reports one for, the one of the latest
	// config; ties: the longest), as a duration, e.g. "1.5ms": from the
	// source's cut-over to this group serving the shard. Kept after the
	// move ends.
	// +optional
	LastWritePause string `json:"lastWritePause,omitempty"`
}

// Phases of a migration, in order.
const (
	// MigrationAnnounced: the config plans the move but the target has
	// not started copying.
	MigrationAnnounced = "Announced"
	// MigrationPreCopying: the target copies the shard (copyPhase snapshot,
	// then delta) while the source still serves it.
	MigrationPreCopying = "PreCopying"
	// MigrationCuttingOver: the config gave the shard to the target, which
	// pulls what is left (Pulling), or has not reached that config yet;
	// writes to the shard wait.
	MigrationCuttingOver = "CuttingOver"
	// MigrationFinishing: the target serves the shard; the two groups
	// acknowledge and the source deletes its copy (Acking, GCing).
	MigrationFinishing = "Finishing"
)

// Migration is shards moving from one group to another.
type Migration struct {
	Source string `json:"source"`
	Target string `json:"target"`
	Shards int32  `json:"shards"`
	// Phase is the least advanced phase of these shards: Announced,
	// PreCopying, CuttingOver or Finishing.
	// +kubebuilder:validation:Enum=Announced;PreCopying;CuttingOver;Finishing
	// +optional
	Phase string `json:"phase,omitempty"`
	// CopyPhase is the copy's sub-phase while pre-copying: snapshot while
	// any shard still copies its snapshot, else delta.
	// +optional
	CopyPhase string `json:"copyPhase,omitempty"`
	// CaughtUpShards counts the shards whose copy reached the source's end
	// in its last round of changes (ready to cut over).
	// +optional
	CaughtUpShards int32 `json:"caughtUpShards,omitempty"`
	// Keys copied so far and in all, over these shards.
	// +optional
	Keys int64 `json:"keys,omitempty"`
	// +optional
	TotalKeys int64 `json:"totalKeys,omitempty"`
	// Bytes copied so far and in all (the source's size of the shards'
	// records), over these shards.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`
	// +optional
	TotalBytes int64 `json:"totalBytes,omitempty"`
	// Progress is keys/totalKeys as a percentage, e.g. "42%"
	// (bytes/totalBytes when no key total is known).
	// +optional
	Progress string `json:"progress,omitempty"`
	// LagEntries is how many of the source's log entries the copy is
	// behind: the largest over these shards.
	// +optional
	LagEntries int64 `json:"lagEntries,omitempty"`
	// BytesPerSecond is the copy rate the operator saw between two
	// observations at least 5s apart (absent until it has two).
	// +optional
	BytesPerSecond int64 `json:"bytesPerSecond,omitempty"`
	// EstimatedTimeLeft is (totalBytes-bytes)/bytesPerSecond, e.g. "1m30s",
	// while bytes are left to copy and the rate is known.
	// +optional
	EstimatedTimeLeft string `json:"estimatedTimeLeft,omitempty"`
	// LastWritePause is the longest write pause of these shards that have
	// cut over, e.g. "1.5ms" (after the move, see groups[].lastWritePause).
	// +optional
	LastWritePause string `json:"lastWritePause,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sm,categories=shardkv
// +kubebuilder:printcolumn:name="Config",type=integer,JSONPath=`.status.configNum`
// +kubebuilder:printcolumn:name="Controllers",type=integer,JSONPath=`.status.controllerVoters`,description="voting members of the controller group"
// +kubebuilder:printcolumn:name="Groups",type=integer,JSONPath=`.status.groupCount`
// +kubebuilder:printcolumn:name="Shards",type=integer,JSONPath=`.spec.shards`
// +kubebuilder:printcolumn:name="Migrating",type=integer,JSONPath=`.status.migratingShards`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Migrate-Rate",type=integer,JSONPath=`.spec.migration.rateBytesPerSecond`,priority=1,description="copy rate limit per group, bytes/s (empty: unlimited)"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// ShardMap is a shardkv cluster: its controller group and shard table.
type ShardMap struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ShardMapSpec   `json:"spec,omitempty"`
	Status ShardMapStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ShardMapList is a list of ShardMaps.
type ShardMapList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ShardMap `json:"items"`
}
