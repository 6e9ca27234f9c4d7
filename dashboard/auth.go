package dashboard

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strconv"
)

// BasicAuth wraps h so that only requests with the user name and password
// given reach it; others are answered 401 with a challenge for realm. The
// comparison takes the same time whatever the input (both sides are
// hashed, then compared in constant time). Serve it over TLS only: Basic
// credentials travel in the clear otherwise.
func BasicAuth(h http.Handler, user, password, realm string) http.Handler {
	wantUser, wantPass := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(password))
	challenge := "Basic realm=" + strconv.Quote(realm) + `, charset="UTF-8"`
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		gotUser, gotPass := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(p))
		userOK := subtle.ConstantTimeCompare(gotUser[:], wantUser[:])
		passOK := subtle.ConstantTimeCompare(gotPass[:], wantPass[:])
		if !ok || userOK&passOK != 1 {
			w.Header().Set("WWW-Authenticate", challenge)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
