package appliance

import (
	"strings"
	"testing"
)

func TestParseTLSGet(t *testing.T) {
	good := map[string]TLSGetSpec{
		"https://10.0.2.2/":                                   {Path: "/", Name: "10.0.2.2"},
		"https://10.0.2.2:8443/api/v10/gateway":               {Path: "/api/v10/gateway", Name: "10.0.2.2"},
		"https://162.159.128.233/api/v10/gateway,discord.com": {Path: "/api/v10/gateway", Name: "discord.com"},
		"https://discord.com/api/v10/gateway":                 {Host: "discord.com", Path: "/api/v10/gateway", Name: "discord.com"},
		"https://Tls-1.test:8443/x,other.test":                {Host: "Tls-1.test", Path: "/x", Name: "other.test"},
		"https://10.0.2.2x/":                                  {Host: "10.0.2.2x", Path: "/", Name: "10.0.2.2x"},
	}
	for v, want := range good {
		got, err := ParseTLSGet(v)
		if err != nil || got.Path != want.Path || got.Name != want.Name || got.Host != want.Host {
			t.Errorf("ParseTLSGet(%q) = %+v, %v; want %+v", v, got, err, want)
		}
	}
	if s, _ := ParseTLSGet("https://10.0.2.2:8443/x"); s.Server.Port() != 8443 {
		t.Errorf("port %d", s.Server.Port())
	}
	if s, _ := ParseTLSGet("https://" + strings.Repeat("a.", 125) + "abc/"); len(s.Host) != 253 {
		t.Errorf("a 253-byte name refused")
	}
	if s, _ := ParseTLSGet("https://10.0.2.2/x"); s.Server.Port() != 443 {
		t.Errorf("default port %d", s.Server.Port())
	}
	for _, v := range []string{"", "http://10.0.2.2/", "https://10.0.2.2", "https://10.0.2.2:/", "https://10.0.2.2:0/",
		"https://10.0.2.2:08443/", "https://10.0.2.2:65536/", "https://10.0.2.2:123456/",
		"https://10.0.2.2/,", "https://10.0.2.2/,a,b", "https://010.0.2.2/", "https://1.2.3.4.5/", "https://1.2.3/",
		"https://a..b/", "https://.a/", "https://a./", "https://a_b/", "https://a b/", "https://a,b/", "https://:443/",
		"https://" + strings.Repeat("a", 64) + ".test/", "https://" + strings.Repeat("a.", 126) + "ab/"} {
		if _, err := ParseTLSGet(v); err == nil {
			t.Errorf("ParseTLSGet(%q) accepted", v)
		}
	}
}
