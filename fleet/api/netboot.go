package api

import (
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/netboot/fleetinv"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
)

// NetbootMachine is one MAC in GET /v1/netboot/machines (no credential,
// ever).
type NetbootMachine struct {
	MAC       string    `json:"mac"`
	State     string    `json:"state"`
	NodeID    string    `json:"node_id,omitempty"`
	Firmware  string    `json:"firmware,omitempty"`
	IP        string    `json:"ip,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// ApproveMachineRequest is the body of POST
// /v1/netboot/machines/{mac}/approve.
type ApproveMachineRequest struct {
	NodeID string `json:"node_id"`
}

// NetbootStep is one step of GET /v1/netboot/machines/{mac}/timeline.
type NetbootStep struct {
	Stage  string    `json:"stage"`
	Detail string    `json:"detail,omitempty"`
	At     time.Time `json:"at"`
}

// RegisterNetboot mounts the operator endpoints of the netboot inventory
// inv (admin token), which `dpxe serve` mounts beside RegisterOperator's:
//
//	GET  /v1/netboot/machines                    every MAC seen or approved
//	POST /v1/netboot/machines/{mac}/approve      {"node_id": NAME}
//	POST /v1/netboot/machines/{mac}/retire
//	GET  /v1/netboot/machines/{mac}/timeline     the boot timeline
//
// Approval goes through the same inventory method as the dashboard's
// (fleetinv.Inventory.Approve): it creates the node at the controller and
// stores no secret with the MAC.
func (s *Server) RegisterNetboot(mux *http.ServeMux, inv *fleetinv.Inventory) {
	n := &netbootAPI{inv: inv}
	mux.HandleFunc("GET /v1/netboot/machines", s.admin(n.machines))
	mux.HandleFunc("POST /v1/netboot/machines/{mac}/approve", s.admin(n.approve))
	mux.HandleFunc("POST /v1/netboot/machines/{mac}/retire", s.admin(n.retire))
	mux.HandleFunc("GET /v1/netboot/machines/{mac}/timeline", s.admin(n.timeline))
}

type netbootAPI struct{ inv *fleetinv.Inventory }

// machine parses the {mac} of the path, answering 400 when it is not one.
func machine(w http.ResponseWriter, r *http.Request) (net.HardwareAddr, bool) {
	hw, err := inventory.ParseMAC(r.PathValue("mac"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "mac", err.Error())
		return nil, false
	}
	return hw, true
}

func (n *netbootAPI) machines(w http.ResponseWriter, r *http.Request) {
	recs, err := n.inv.Nodes(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, "", err.Error())
		return
	}
	out := make([]NetbootMachine, 0, len(recs))
	for _, rec := range recs {
		out = append(out, NetbootMachine{MAC: inventory.MACKey(rec.MAC), State: string(rec.State), NodeID: rec.ID,
			Firmware: string(rec.Firmware), IP: rec.IP, FirstSeen: rec.FirstSeen, LastSeen: rec.LastSeen})
	}
	writeJSON(w, http.StatusOK, map[string]any{"machines": out})
}

func (n *netbootAPI) approve(w http.ResponseWriter, r *http.Request) {
	hw, ok := machine(w, r)
	if !ok {
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req ApproveMachineRequest
	if err := appliance.DecodeStrict(body, &req); err != nil {
		badRequest(w, err)
		return
	}
	if err := n.inv.Approve(r.Context(), inventory.MACKey(hw), req.NodeID); err != nil {
		writeError(w, http.StatusBadRequest, "node_id", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"mac": inventory.MACKey(hw), "node_id": req.NodeID, "state": string(inventory.Approved)})
}

func (n *netbootAPI) retire(w http.ResponseWriter, r *http.Request) {
	hw, ok := machine(w, r)
	if !ok {
		return
	}
	if err := n.inv.Retire(r.Context(), hw); errors.Is(err, inventory.ErrUnknownMAC) {
		writeError(w, http.StatusNotFound, "mac", "never seen")
		return
	} else if err != nil {
		writeError(w, http.StatusInternalServerError, "", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"mac": inventory.MACKey(hw), "state": string(inventory.Retired)})
}

func (n *netbootAPI) timeline(w http.ResponseWriter, r *http.Request) {
	hw, ok := machine(w, r)
	if !ok {
		return
	}
	evs, err := n.inv.Timeline(r.Context(), hw)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "", err.Error())
		return
	}
	out := make([]NetbootStep, 0, len(evs))
	for _, e := range evs {
		out = append(out, NetbootStep{Stage: string(e.Stage), Detail: e.Detail, At: e.At})
	}
	writeJSON(w, http.StatusOK, map[string]any{"mac": inventory.MACKey(hw), "timeline": out})
}
