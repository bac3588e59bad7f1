// Package bus is a service bus over omnibus.
package bus
