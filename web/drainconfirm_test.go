package web

import (
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// moveRow is one row of the drain confirmation's table: shards, count,
// from (or <em>no owner</em>), to (or no owner).
var moveRow = regexp.MustCompile(`<tr[^>]*><td>(\d+)(?:-(\d+))?</td><td>(\d+)</td><td>(?:<em>no owner</em>|([^<]+))</td><td><strong>([^<]+)</strong></td></tr>`)

// TestDrainConfirmationIsTheDrain: the table the drain confirmation shows
// is the plan change the confirmed drain then makes, shard for shard, on a
// fleet of uneven capacities where the other nodes' ranges shift too.
// (fleet/controller's TestDrainPreviewIsThePlan checks the preview itself
// over random fleets; this checks the page shows that preview and nothing
// computed beside it.)
func TestDrainConfirmationIsTheDrain(t *testing.T) {
	f := newTestFleet(t, fleetOpts{total: 100, maxConc: 4})
	f.addNodes(40, "node-a")
	f.addNodes(24, "node-b")
	f.addNodes(36, "node-c")
	f.addNodes(32, "node-d")
	ids := []string{"node-a", "node-b", "node-c", "node-d"}
	f.settle(ids...)
	c := f.client()
	csrf := f.login(c, testToken)

	owners := func() []string {
		out := make([]string, 100)
		for _, r := range f.ctrl.Plan().Ranges {
			for s := r.Start; s < r.Start+r.Count; s++ {
				out[s] = r.NodeID
			}
		}
		return out
	}
	before := owners()
	code, page := get(t, c, f.srv.URL+"/nodes/node-b/drain")
	rows := moveRow.FindAllStringSubmatch(page, -1)
	if code != http.StatusOK || len(rows) < 2 {
		t.Fatalf("drain confirmation: %d, %d move rows (want the drained node's and the shifts of others)\n%s", code, len(rows), page)
	}
	if _, table, _ := strings.Cut(page, `id="drain-moves"`); strings.Count(strings.Split(table, "</table>")[0], "<tr")-1 != len(rows) {
		t.Fatalf("the table has rows this test does not read:\n%s", page)
	}
	want := append([]string(nil), before...)
	for _, m := range rows {
		lo, _ := strconv.Atoi(m[1])
		hi := lo
		if m[2] != "" {
			hi, _ = strconv.Atoi(m[2])
		}
		if n, _ := strconv.Atoi(m[3]); n != hi-lo+1 {
			t.Fatalf("row %q: count %d for %d shards", m[0], n, hi-lo+1)
		}
		to := m[5]
		if to == "no owner" {
			to = ""
		}
		for s := lo; s <= hi; s++ {
			if before[s] != strings.TrimSpace(m[4]) {
				t.Fatalf("row %q: shard %d is %q's now, the row says %q", m[0], s, before[s], m[4])
			}
			want[s] = to
		}
	}
	if code, _, _ := post(t, c, f.srv.URL+"/nodes/node-b/drain", url.Values{"csrf": {csrf}}); code != http.StatusSeeOther {
		t.Fatalf("confirmed drain: %d", code)
	}
	if got := owners(); !reflect.DeepEqual(got, want) {
		t.Fatalf("plan after the drain differs from the confirmation:\n got %v\nwant %v", got, want)
	}
}
