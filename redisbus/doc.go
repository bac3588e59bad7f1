// Package redisbus is omnibus's Redis Streams transport, scheme redis://,
// on github.com/redis/go-redis/v9. It needs Redis 7.0 or later.
//
// Import it for its side effect:
//
//	import _ "github.com/omnibus-go/omnibus/redisbus"
//
//	c, err := omnibus.Open(ctx, "redis://127.0.0.1:6379")
package redisbus
