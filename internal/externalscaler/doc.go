// Package externalscaler is KEDA's external scaler service, generated
// from externalscaler.proto (KEDA's pkg/scalers/externalscaler, kept here
// unchanged) with protoc-gen-go and protoc-gen-go-grpc. Regenerate with
// go generate after replacing the proto with a newer one of KEDA's.
package externalscaler

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative externalscaler.proto
