package dlq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
)

// deleteKinesis removes the streams and lease tables on the emulators
// whose names hold ns.
func deleteKinesis(t testing.TB, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secretTEST", "")}
	kin := kinesis.NewFromConfig(cfg, func(o *kinesis.Options) { o.BaseEndpoint = aws.String("http://127.0.0.1:4567") })
	ddb := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String("http://127.0.0.1:4568") })
	if out, err := kin.ListStreams(ctx, &kinesis.ListStreamsInput{Limit: aws.Int32(10000)}); err == nil {
		for _, s := range out.StreamNames {
			if strings.Contains(s, ns) {
				_, _ = kin.DeleteStream(ctx, &kinesis.DeleteStreamInput{StreamName: aws.String(s)})
			}
		}
	} else {
		t.Logf("cleanup: list streams: %v", err)
	}
	var start *string
	for {
		out, err := ddb.ListTables(ctx, &dynamodb.ListTablesInput{ExclusiveStartTableName: start})
		if err != nil {
			t.Logf("cleanup: list tables: %v", err)
			return
		}
		for _, name := range out.TableNames {
			if strings.Contains(name, ns) {
				_, _ = ddb.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
			}
		}
		if out.LastEvaluatedTableName == nil {
			return
		}
		start = out.LastEvaluatedTableName
	}
}
