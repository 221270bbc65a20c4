package appliance

import (
	"fmt"
	"math/rand"
	"strings"
)

// mutBytes are what a mutation writes: structure, escapes, literals, controls.
const mutBytes = "{}[]\":,\\ 0-aetu\x00\x1f"

// GatewayScanCorpus makes the scanner's self-test messages from a seed:
// Gateway payloads as Discord shapes them (Hello, READY with many guilds,
// dispatches with nested d, op 9, ACKs) with their members in every order,
// edge cases of each captured field, and then mutations of them all (cut
// short, a byte changed, a byte inserted) so that refusals at every place
// are exercised too.
func GatewayScanCorpus(seed int64) [][]byte {
	r := rand.New(rand.NewSource(seed))
	var base [][]byte
	add := func(s string) { base = append(base, []byte(s)) }
	shuffle := func(members []string) string {
		r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		return "{" + strings.Join(members, ",") + "}"
	}
	for i := 0; i < 6; i++ {
		add(shuffle([]string{`"op":10`, `"d":{"heartbeat_interval":41250,"_trace":["gateway-prd"]}`, `"s":null`, `"t":null`}))
		add(shuffle([]string{`"op":11`, `"s":null`, `"t":null`, `"d":null`}))
		add(shuffle([]string{`"op":9`, `"d":` + []string{"true", "false"}[i%2], `"s":null`, `"t":null`}))
		add(shuffle([]string{`"op":7`, `"d":null`}))
		add(shuffle([]string{`"op":1`, `"d":` + fmt.Sprint(i*7)}))
		guilds := make([]string, 1+r.Intn(40))
		for j := range guilds {
			guilds[j] = fmt.Sprintf(`{"id":"%d","unavailable":true}`, 100000+r.Intn(1<<30))
		}
		ready := []string{`"v":10`, `"user":{"id":"1","username":"bot","bot":true,"session_id":"not-this-one"}`,
			`"guilds":[` + strings.Join(guilds, ",") + `]`,
			fmt.Sprintf(`"session_id":"%032x"`, r.Uint64()),
			`"resume_gateway_url":"ws://10.0.2.9:8080/resume"`, `"shard":[0,2]`, `"application":{"id":"1","flags":0}`}
		r.Shuffle(len(ready), func(a, b int) { ready[a], ready[b] = ready[b], ready[a] })
		add(shuffle([]string{`"op":0`, fmt.Sprintf(`"s":%d`, 1+r.Intn(5)), `"t":"READY"`, `"d":{` + strings.Join(ready, ",") + `}`}))
		add(shuffle([]string{`"op":0`, fmt.Sprintf(`"s":%d`, r.Uint32()), `"t":"GUILD_CREATE"`,
			`"d":{"id":"5","channels":[{"id":"6","name":"general","permission_overwrites":[]}],"members":[{"user":{"id":"9"},"roles":[],"nick":null,"deaf":false,"mute":false,"joined_at":"2024-01-01T00:00:00.000000+00:00","premium":1.5e3,"x":-0.25E-2}],"description":"tab\tno; \"quoted\" \\ \/ \u00e9 \ud83d\ude00"}`}))
		add(shuffle([]string{`"op":0`, `"s":2`, `"t":"RESUMED"`, `"d":{"_trace":[]}`}))
	}
	// the captured fields' edges
	for _, s := range []string{
		`{"op":0}`, `{}`, `{"op":4294967295}`, `{"op":4294967296}`, `{"op":01}`, `{"op":0.0}`, `{"op":-1}`, `{"op":1e2}`,
		`{"op":"1"}`, `{"op":null}`, `{"op":true}`, `{"op":[1]}`, `{"op":{}}`, `{"op":1,"op":2}`, `{"op":1,"op":"x"}`,
		`{"s":null}`, `{"s":"1"}`, `{"s":0}`, `{"s":4294967295}`, `{"s":99999999999}`, `{"s":false}`,
		`{"t":"READY"}`, `{"t":"REA\u0044Y"}`, `{"t":"` + strings.Repeat("A", 31) + `"}`, `{"t":"` + strings.Repeat("A", 32) + `"}`,
		`{"t":null}`, `{"t":1}`, `{"t":""}`,
		`{"d":true}`, `{"d":false}`, `{"d":null}`, `{"d":0}`, `{"d":"x"}`, `{"d":[]}`, `{"d":{}}`, `{"d":[{"session_id":"x"}]}`,
		`{"d":{"session_id":"` + strings.Repeat("s", 63) + `"}}`, `{"d":{"session_id":"` + strings.Repeat("s", 64) + `"}}`,
		`{"d":{"session_id":"a\"b"}}`, `{"d":{"session_id":""}}`, `{"d":{"session_id":7}}`,
		`{"d":{"resume_gateway_url":"ws:\/\/x"}}`, `{"d":{"resume_gateway_url":"` + strings.Repeat("u", 211) + `"}}`,
		`{"d":{"resume_gateway_url":"` + strings.Repeat("u", 212) + `"}}`, `{"d":{"resume_gateway_url":null}}`,
		`{"d":{"heartbeat_interval":45000}}`, `{"d":{"heartbeat_interval":"45000"}}`, `{"d":{"heartbeat_interval":045}}`,
		`{"d":{"x":{"session_id":"deep","heartbeat_interval":5}},"session_id":"top"}`,
		`{"d":{"session_id":"one"},"d":{"heartbeat_interval":9}}`, `{"d":{"session_id":"one"},"d":true}`,
		`{"session_id_and_more_than_twenty":"x","d":{"heartbeat_interval_plus_some_more":1}}`, `{"o\u0070":1}`,
		"  \r\n\t{ \"op\" : 1 , \"d\" : { } } \n", `{"op":1}  `, `{"op":1} {"op":2}`, `{"op":1}x`, ` `, ``,
		`{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
		`{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
		`{"a":"\x"}`, `{"a":"\u12G4"}`, "{\"a\":\"\x01\"}", `{"a":tru}`, `{"a":nul,"b":1}`, `{"a":1,}`, `{,}`, `{"a"}`, `{"a":}`,
		`{"a":[1,]}`, `{"a":[,1]}`, `{"a":[1 2]}`, `{"a":1 "b":2}`, `{"a":]`, `{"a":[}`, `[1]`, `"x"`, `{"a":1}}`, `{"a":-}`, `{"a":1-2e+}`,
		`{"a":` + "\xff\xfe" + `}`, `{"a":"` + "\xff\xfe" + `"}`, `{"op":0,"s":1,"t":"READY","d":{"session_id":"abc","resume_gateway_url":"ws://1.2.3.4/r"}`,
	} {
		add(s)
	}
	out := append([][]byte(nil), base...)
	for _, m := range base {
		for k := 0; k < 3; k++ {
			if len(m) == 0 {
				break
			}
			i := r.Intn(len(m))
			switch k {
			case 0:
				out = append(out, append([]byte(nil), m[:i]...))
			case 1:
				b := append([]byte(nil), m...)
				b[i] = mutBytes[r.Intn(len(mutBytes))]
				out = append(out, b)
			case 2:
				b := append(append(append([]byte(nil), m[:i]...), mutBytes[r.Intn(len(mutBytes))]), m[i:]...)
				out = append(out, b)
			}
		}
	}
	// two large ones: many pieces in the kernel, deep captures far in
	big := `{"t":"GUILD_CREATE","d":{"members":[` + strings.TrimSuffix(strings.Repeat(`{"user":{"id":"12345678901234567","username":"member"},"roles":["1","2"]},`, 3000), ",") + `],"session_id":"late"},"s":77,"op":0}`
	out = append(out, []byte(big), []byte(big[:len(big)-1]))
	return out
}
