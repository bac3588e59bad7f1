package natsbus

import "context"

type claims struct{}

func (c *claims) leave() {}

func (s *sub) startClaims(ctx context.Context) error { return nil }
