// Package kinesisbus is omnibus's Amazon Kinesis Data Streams transport,
// scheme kinesis://, built on the AWS SDK for Go v2, with leases and
// checkpoints in DynamoDB as the Kinesis Client Library keeps them.
package kinesisbus
