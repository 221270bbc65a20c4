package smoke

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"
)

// seconds formats d as seconds with one decimal ("12.3s").
func seconds(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// Line is a result's one-line verdict, for a terminal or a CI log:
//
//	PASS kernel-seabios    1.9s to "selftest: pass"  [tcg, 2.1s]  boot: bios multiboot (QEMU -kernel); digests: 27 equal ...
//
// with the time to the awaited line (or "-"), the accelerator and the
// path's wall time, then the checks that passed or why it did not pass.
func (res Result) Line() string {
	to := "-"
	if res.ToLine > 0 {
		to = seconds(res.ToLine)
	}
	what := res.Reason
	if res.Status == Pass {
		var parts []string
		for _, c := range res.Checks {
			switch c.Name {
			case "boot source", "digests", "gateway", "controller":
				parts = append(parts, c.Name+": "+c.Detail)
			}
		}
		what = strings.Join(parts, "; ")
	}
	accel := res.Accel
	if accel == "" {
		accel = "no boot"
	}
	return fmt.Sprintf("%-5s %-16s %6s to %-18q [%s, %s]  %s", strings.ToUpper(string(res.Status)), res.Path, to, res.Awaited, accel, seconds(res.Elapsed), what)
}

// WriteText writes a result's line and, when it did not pass, the
// console's last lines and the netboot peers' log lines, indented.
func (res Result) WriteText(w io.Writer) error {
	var b strings.Builder
	b.WriteString(res.Line() + "\n")
	if res.Status != Pass {
		if len(res.Tail) > 0 {
			fmt.Fprintf(&b, "      serial console, last %d lines:\n", len(res.Tail))
			for _, l := range res.Tail {
				b.WriteString("      | " + l + "\n")
			}
		}
		if len(res.Log) > 0 {
			b.WriteString("      log:\n")
			for _, l := range res.Log {
				b.WriteString("      | " + l + "\n")
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Summary is the report's closing line.
func (r *Report) Summary() string {
	pass, fail, errs := r.Counts()
	verdict := "PASS"
	if !r.Passed() {
		verdict = "FAIL"
	}
	return fmt.Sprintf("%s: %d paths, %d passed, %d failed, %d could not run, in %s (kernel %s, seed %d, %d at a time)",
		verdict, len(r.Results), pass, fail, errs, seconds(r.Elapsed), orDash(r.KernelVersion), r.Seed, r.Jobs)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// jsonReport is the --json form of a Report.
type jsonReport struct {
	Out           string       `json:"out"`
	KernelVersion string       `json:"kernel_version"`
	Seed          uint32       `json:"seed"`
	Started       time.Time    `json:"started"`
	ElapsedS      float64      `json:"elapsed_s"`
	Jobs          int          `json:"jobs"`
	Passed        bool         `json:"passed"`
	Results       []jsonResult `json:"results"`
}

type jsonResult struct {
	Path     string   `json:"path"`
	Firmware string   `json:"firmware"`
	Medium   Medium   `json:"medium"`
	Status   Status   `json:"status"`
	Reason   string   `json:"reason,omitempty"`
	Awaited  string   `json:"awaited"`
	ToLineS  float64  `json:"to_line_s"`
	ElapsedS float64  `json:"elapsed_s"`
	Accel    string   `json:"accel,omitempty"`
	Checks   []Check  `json:"checks"`
	Tail     []string `json:"tail,omitempty"`
	Log      []string `json:"log,omitempty"`
}

// WriteJSON writes the report as one JSON document (no serial consoles:
// the JUnit report carries those).
func (r *Report) WriteJSON(w io.Writer) error {
	j := jsonReport{Out: r.Out, KernelVersion: r.KernelVersion, Seed: r.Seed, Started: r.Started,
		ElapsedS: round3(r.Elapsed), Jobs: r.Jobs, Passed: r.Passed(), Results: []jsonResult{}}
	for _, res := range r.Results {
		j.Results = append(j.Results, jsonResult{Path: res.Path, Firmware: res.Firmware, Medium: res.Medium, Status: res.Status,
			Reason: res.Reason, Awaited: res.Awaited, ToLineS: round3(res.ToLine), ElapsedS: round3(res.Elapsed), Accel: res.Accel,
			Checks: res.Checks, Tail: res.Tail, Log: res.Log})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(j)
}

func round3(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

// The JUnit XML schema as CI systems read it (GitLab's test reports,
// Jenkins, the GitHub Actions JUnit reporters): one testsuite, one
// testcase per path, <failure> when the artifacts failed, <error> when the
// path could not run, the serial console in <system-out>.
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Time       string          `xml:"time,attr"`
	Timestamp  string          `xml:"timestamp,attr"`
	Hostname   string          `xml:"hostname,attr,omitempty"`
	Properties []junitProperty `xml:"properties>property"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitProblem `xml:"failure,omitempty"`
	Error     *junitProblem `xml:"error,omitempty"`
	SystemOut *junitText    `xml:"system-out,omitempty"`
}

type junitText struct {
	Text string `xml:",cdata"`
}

type junitProblem struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",cdata"`
}

// junitClass is every test case's classname.
const junitClass = "dpxe.smoke"

// maxSystemOut bounds a test case's <system-out>.
const maxSystemOut = 1 << 20

func junitTime(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// WriteJUnit writes the report as JUnit XML.
func (r *Report) WriteJUnit(w io.Writer) error {
	_, fail, errs := r.Counts()
	host, _ := os.Hostname()
	s := junitSuite{Name: "dpxe smoke", Tests: len(r.Results), Failures: fail, Errors: errs, Time: junitTime(r.Elapsed),
		Timestamp: r.Started.UTC().Format("2006-01-02T15:04:05"), Hostname: host,
		Properties: []junitProperty{
			{"out", r.Out}, {"kernel_version", r.KernelVersion}, {"seed", fmt.Sprint(r.Seed)}, {"jobs", fmt.Sprint(r.Jobs)},
		}}
	for _, res := range r.Results {
		c := junitCase{Name: res.Path, Classname: junitClass, Time: junitTime(res.Elapsed), SystemOut: &junitText{xmlText(res.systemOut())}}
		if res.Status != Pass {
			p := &junitProblem{Message: xmlText(res.Reason), Type: string(res.Status), Text: xmlText(res.problemText())}
			if res.Status == Fail {
				c.Failure = p
			} else {
				c.Error = p
			}
		}
		s.Cases = append(s.Cases, c)
	}
	doc := junitSuites{Name: "dpxe smoke", Tests: s.Tests, Failures: fail, Errors: errs, Time: s.Time, Suites: []junitSuite{s}}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// xmlText drops the characters XML 1.0 does not allow (control
// characters other than tab, CR and LF; U+FFFE, U+FFFF), which a serial
// console may hold and CDATA cannot escape.
func xmlText(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			return r
		case r < 0x20, r == 0xFFFE, r == 0xFFFF, r == utf8.RuneError:
			return -1
		}
		return r
	}, s)
}

// checksText lists the checks, one per line.
func (res Result) checksText() string {
	var b strings.Builder
	for _, c := range res.Checks {
		fmt.Fprintf(&b, "%-4s %-12s %s\n", c.Status, c.Name, c.Detail)
	}
	return b.String()
}

// problemText is a failure's body: the line, the checks, the console's
// last lines and the peers' log.
func (res Result) problemText() string {
	var b strings.Builder
	b.WriteString(res.Line() + "\n\n" + res.checksText())
	if len(res.Tail) > 0 {
		b.WriteString("\nserial console, last lines:\n" + strings.Join(res.Tail, "\n") + "\n")
	}
	if len(res.Log) > 0 {
		b.WriteString("\nlog:\n" + strings.Join(res.Log, "\n") + "\n")
	}
	return b.String()
}

// systemOut is the checks and the whole console, cleaned of terminal
// escapes, at most maxSystemOut bytes.
func (res Result) systemOut() string {
	var b strings.Builder
	b.WriteString(res.checksText())
	if res.Serial != "" {
		b.WriteString("\nserial console:\n")
		for _, l := range strings.Split(res.Serial, "\n") {
			if b.Len() > maxSystemOut {
				b.WriteString("[truncated]\n")
				break
			}
			b.WriteString(cleanLine(l) + "\n")
		}
	}
	return b.String()
}
