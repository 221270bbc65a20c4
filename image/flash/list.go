package flash

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/mbrloader"
)

// Medium is a block device as `dpxe flash --list` shows it.
type Medium struct {
	*Target
	Loader bool   // sector 0 carries our MBR loader's patch block (DPXB)
	DPXE   bool   // ... and image.ReadUSBConfig accepts the layout and DPXE.CFG
	Node   string // node= from DPXE.CFG
	Ctrl   string // controller= from DPXE.CFG
	Note   string // why it is not (fully) recognised, or could not be read
}

// List returns the whole block devices of the system, sorted by name: only
// removable ones unless all is set. Devices of size 0 (an unattached loop
// device, an empty card reader) are left out. Each is probed read-only for
// Discord-PXE media.
func (e *Env) List(all bool) ([]Medium, error) {
	ents, err := os.ReadDir(filepath.Join(e.SysRoot, "block"))
	if err != nil {
		return nil, err
	}
	var out []Medium
	for _, ent := range ents {
		dev, err := ParseDevNum(readTrim(filepath.Join(e.SysRoot, "block", ent.Name(), "dev")))
		if err != nil {
			continue
		}
		t := &Target{Path: filepath.Join(e.DevRoot, ent.Name())}
		if err := e.inspectDev(t, dev); err != nil {
			return nil, fmt.Errorf("%s: %w", ent.Name(), err)
		}
		if t.Size == 0 || (!all && !t.Removable) {
			continue
		}
		m := Medium{Target: t}
		m.probe()
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// probe reads sector 0 and, when it holds our loader, DPXE.CFG.
func (m *Medium) probe() {
	f, err := os.Open(m.Path)
	if err != nil {
		m.Note = err.Error()
		return
	}
	sector0 := make([]byte, mbrloader.SectorSize)
	_, err = io.ReadFull(f, sector0)
	f.Close()
	if err != nil {
		m.Note = "reading sector 0: " + err.Error()
		return
	}
	if _, err := mbrloader.ReadPatch(sector0); err != nil {
		return
	}
	m.Loader = true
	cfg, err := image.ReadUSBConfig(m.Path)
	if err != nil {
		m.Note = err.Error()
		return
	}
	m.DPXE = true
	c, err := appliance.ParseBootConfig(cfg.Raw)
	if err != nil {
		m.Note = "DPXE.CFG invalid: " + err.Error()
		return
	}
	m.Node, m.Ctrl = c.NodeID, c.Controller
}
