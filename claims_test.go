package spate

import (
	"fmt"
	"testing"
)

func TestClaimKindsAndOrder(t *testing.T) {
	in := []claimInput{
		{id: "z-expired", status: statusRunnable, owner: "dead", epoch: 3, hasSpec: true},
		{id: "y-reclaim", status: statusRunnable, owner: "me", epoch: 2, leaseOwner: "me", hasSpec: true},
		{id: "x-released", status: statusRunnable, epoch: 4, hasSpec: true},
		{id: "w-create", status: statusRunnable, hasSpec: true},
		{id: "a-create", status: statusRunnable, hasSpec: true},
		{id: "foreign", status: statusRunnable, owner: "peer", leaseOwner: "peer", epoch: 1, hasSpec: true},
		{id: "done", status: statusCompleted, hasSpec: true},
		{id: "parked", status: statusQuarant, hasSpec: true},
		{id: "mine", status: statusRunnable, owner: "me", leaseOwner: "me", leaseOurs: true, held: true, hasSpec: true},
		{id: "leftover", status: statusRunnable, epoch: 2, leaseOwner: "me", leaseOurs: true, hasSpec: true},
	}
	var got []string
	for _, c := range claimCandidates(in, "me", 4) {
		got = append(got, fmt.Sprintf("%s:%s:%t", c.id, c.kind, c.quarantine))
	}
	want := "[a-create:create:false w-create:create:false leftover:released:false x-released:released:false y-reclaim:reclaim:false z-expired:expired:false]"
	if fmt.Sprint(got) != want {
		t.Fatalf("candidates:\n got %v\nwant %s", got, want)
	}
}

func TestClaimAttemptsGateFlipsToQuarantineAtTheCap(t *testing.T) {
	for attempts := uint32(0); attempts < 6; attempts++ {
		for _, in := range []claimInput{
			{id: "expired", status: statusRunnable, owner: "dead", epoch: 1, attempts: attempts, hasSpec: true},
			{id: "reclaim", status: statusRunnable, owner: "me", epoch: 1, attempts: attempts, leaseOwner: "me", hasSpec: true},
		} {
			c := claimCandidates([]claimInput{in}, "me", 4)
			if len(c) != 1 {
				t.Fatalf("%s attempts=%d: %v", in.id, attempts, c)
			}
			if want := attempts+1 >= 4; c[0].quarantine != want {
				t.Errorf("%s attempts=%d: quarantine=%t, want %t", in.id, attempts, c[0].quarantine, want)
			}
		}
		// Graceful kinds never quarantine, however many attempts were spent.
		for _, in := range []claimInput{
			{id: "create", status: statusRunnable, attempts: attempts, hasSpec: true},
			{id: "released", status: statusRunnable, epoch: 2, attempts: attempts, hasSpec: true},
		} {
			if c := claimCandidates([]claimInput{in}, "me", 4); len(c) != 1 || c[0].quarantine {
				t.Errorf("%s attempts=%d: %v", in.id, attempts, c)
			}
		}
	}
}

func TestSpeclessSplitsAreQuarantinableButNotClaimable(t *testing.T) {
	in := []claimInput{
		{id: "claimable-without-spec", status: statusRunnable},
		{id: "poison-without-spec", status: statusRunnable, owner: "dead", epoch: 1, attempts: 3},
	}
	got := claimCandidates(in, "me", 4)
	if len(got) != 1 || got[0].id != "poison-without-spec" || !got[0].quarantine {
		t.Fatalf("got %v", got)
	}
}

func TestClaimOrderIgnoresWeight(t *testing.T) {
	// The scan has no weight input at all: order is kind, then id.
	in := []claimInput{{id: "b", status: statusRunnable, hasSpec: true}, {id: "a", status: statusRunnable, hasSpec: true}}
	if got := claimCandidates(in, "me", 4); got[0].id != "a" {
		t.Fatalf("got %v", got)
	}
}

func TestSelfFencedReclaimConsumesNoAttempt(t *testing.T) {
	in := claimInput{id: "s", status: statusRunnable, owner: "me", epoch: 3, attempts: 3, hasSpec: true}
	if c := claimCandidates([]claimInput{in}, "me", 4); len(c) != 1 || !c[0].quarantine {
		t.Fatalf("a crashed predecessor's split at the cap is quarantined: %v", c)
	}
	in.selfFenced = true
	c := claimCandidates([]claimInput{in}, "me", 4)
	if len(c) != 1 || c[0].quarantine || c[0].kind != claimReleased {
		t.Fatalf("a split this process self-fenced is re-claimed attempt-free: %v", c)
	}
}
