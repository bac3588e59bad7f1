package natsbus

import "github.com/omnibus-go/omnibus/driver"

// EmbeddedOwner returns, for a connection opened on the embedded URL, the
// process that runs its server and the server's address.
func EmbeddedOwner(c driver.Conn) (pid int, url string) {
	return c.(*conn).srv.owner()
}
