package smoke

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"strings"
	"testing"
	"time"
)

func sampleReport() *Report {
	return &Report{Out: "out", KernelVersion: "0.1.0", Seed: 7, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Elapsed: 21500 * time.Millisecond, Jobs: 2, Results: []Result{
			{Path: "kernel-seabios", Status: Pass, Awaited: lineSelfTestPass, ToLine: 1900 * time.Millisecond, Elapsed: 2 * time.Second, Accel: "tcg",
				Checks: []Check{{"boot source", Pass, "bios multiboot (QEMU -kernel)"}, {"digests", Pass, "19 equal the Go reference (seed 7)"}},
				Serial: "\x1b[2JDiscord-PXE shard kernel 0.1.0\r\nselftest: pass\r\n"},
			{Path: "usb-ovmf", Status: Fail, Reason: `exit: no "selftest: pass" within 2m0s (tcg)`, Awaited: lineSelfTestPass, Elapsed: 2 * time.Minute, Accel: "tcg",
				Checks: []Check{{"exit", Fail, `no "selftest: pass" within 2m0s (tcg)`}},
				Serial: "BdsDxe: loading \x00\x01Boot0001 ]]> odd\r\n", Tail: []string{"BdsDxe: loading Boot0001 ]]> odd"}},
			{Path: "netboot-seabios", Status: Error, Reason: "peers: no gateway-emulator binary", Awaited: lineReady,
				Checks: []Check{{"peers", Error, "no gateway-emulator binary"}}, Log: []string{"dpxe serve: listening"}},
		}}
}

// junitDoc is how a CI system reads the report.
type junitDoc struct {
	Tests    int `xml:"tests,attr"`
	Failures int `xml:"failures,attr"`
	Errors   int `xml:"errors,attr"`
	Suites   []struct {
		Name       string `xml:"name,attr"`
		Tests      int    `xml:"tests,attr"`
		Properties []struct {
			Name  string `xml:"name,attr"`
			Value string `xml:"value,attr"`
		} `xml:"properties>property"`
		Cases []struct {
			Name      string `xml:"name,attr"`
			Classname string `xml:"classname,attr"`
			Time      string `xml:"time,attr"`
			Failure   *struct {
				Message string `xml:"message,attr"`
				Type    string `xml:"type,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
			SystemOut string `xml:"system-out"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func TestWriteJUnit(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteJUnit(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), `<?xml version="1.0" encoding="UTF-8"?>`) {
		t.Errorf("no XML declaration: %.60s", b.String())
	}
	var d junitDoc
	if err := xml.Unmarshal(b.Bytes(), &d); err != nil {
		t.Fatalf("the report is not well-formed XML: %v\n%s", err, b.String())
	}
	if d.Tests != 3 || d.Failures != 1 || d.Errors != 1 || len(d.Suites) != 1 || len(d.Suites[0].Cases) != 3 {
		t.Fatalf("counts %+v", d)
	}
	props := map[string]string{}
	for _, p := range d.Suites[0].Properties {
		props[p.Name] = p.Value
	}
	if props["kernel_version"] != "0.1.0" || props["seed"] != "7" {
		t.Errorf("properties %v", props)
	}
	pass, fail, errc := d.Suites[0].Cases[0], d.Suites[0].Cases[1], d.Suites[0].Cases[2]
	if pass.Name != "kernel-seabios" || pass.Classname != junitClass || pass.Time != "2.000" || pass.Failure != nil || pass.Error != nil {
		t.Errorf("passing case %+v", pass)
	}
	if !strings.Contains(pass.SystemOut, "Discord-PXE shard kernel 0.1.0\nselftest: pass") || strings.Contains(pass.SystemOut, "\x1b") {
		t.Errorf("system-out of the passing case %q", pass.SystemOut)
	}
	if fail.Failure == nil || fail.Failure.Type != "fail" || fail.Failure.Message != `exit: no "selftest: pass" within 2m0s (tcg)` ||
		!strings.Contains(fail.Failure.Text, "BdsDxe: loading Boot0001 ]]> odd") || fail.Error != nil {
		t.Errorf("failing case %+v", fail)
	}
	if errc.Error == nil || errc.Error.Message != "peers: no gateway-emulator binary" || errc.Failure != nil {
		t.Errorf("case that could not run %+v", errc)
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var j struct {
		Passed  bool `json:"passed"`
		Results []struct {
			Path    string   `json:"path"`
			Status  string   `json:"status"`
			ToLineS float64  `json:"to_line_s"`
			Tail    []string `json:"tail"`
			Checks  []Check  `json:"checks"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b.Bytes(), &j); err != nil {
		t.Fatal(err)
	}
	if j.Passed || len(j.Results) != 3 || j.Results[0].ToLineS != 1.9 || j.Results[1].Status != "fail" || len(j.Results[1].Tail) != 1 ||
		j.Results[0].Checks[1].Name != "digests" {
		t.Errorf("JSON report %+v", j)
	}
	if strings.Contains(b.String(), "Discord-PXE shard kernel") {
		t.Error("the JSON report carries the serial console")
	}
}

func TestTextReport(t *testing.T) {
	r := sampleReport()
	var b bytes.Buffer
	for _, res := range r.Results {
		res.WriteText(&b)
	}
	out := b.String()
	for _, want := range []string{
		`PASS  kernel-seabios     1.9s to "selftest: pass"`,
		"[tcg, 2.0s]  boot source: bios multiboot (QEMU -kernel); digests: 19 equal",
		`FAIL  usb-ovmf              - to "selftest: pass"   [tcg, 120.0s]  exit: no "selftest: pass" within 2m0s (tcg)`,
		"      | BdsDxe: loading Boot0001 ]]> odd",
		"ERROR netboot-seabios",
		"[no boot, 0.0s]  peers: no gateway-emulator binary",
		"      log:\n      | dpxe serve: listening",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	if got := r.Summary(); got != "FAIL: 3 paths, 1 passed, 1 failed, 1 could not run, in 21.5s (kernel 0.1.0, seed 7, 2 at a time)" {
		t.Errorf("Summary = %q", got)
	}
	if r.Passed() {
		t.Error("Passed with a failure")
	}
	if (&Report{}).Passed() {
		t.Error("an empty report passed")
	}
}
