package api

import "net/http"

// SetControllerPin makes GET /v1/controller/pin answer with pin: the
// SHA-256 of the controller's TLS public key (fleet/ctlcert), the value of
// the boot config's controller_pin=. "" (the default) means this
// controller serves no HTTPS.
func (s *Server) SetControllerPin(pin string) { s.pin = pin }

// controllerPin answers GET /v1/controller/pin (admin): {"pin": HEX}, so
// `dpxe flash` can write controller_pin= without the operator copying it.
func (s *Server) controllerPin(w http.ResponseWriter, r *http.Request) {
	if s.pin == "" {
		writeError(w, http.StatusNotFound, "pin", "this controller serves no HTTPS (start dpxe serve with --tls-listen)")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"pin": s.pin})
}
