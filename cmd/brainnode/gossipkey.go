package main

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// gossipKeyCmd writes a new gossip key file, for --gossip-key-file.
func gossipKeyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "gossip-key FILE",
		Short: "Write a new random gossip key (32 bytes, base64) to FILE for --gossip-key-file; a FILE that exists is kept",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			if _, err := os.Stat(path); err == nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s exists; kept\n", path)
				return nil
			}
			key := make([]byte, 32)
			if _, err := rand.Read(key); err != nil {
				return err
			}
			// Written whole or not at all: a temporary file renamed.
			tmp, err := os.CreateTemp(filepath.Dir(path), ".gossip-key-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			if _, err := fmt.Fprintln(tmp, base64.StdEncoding.EncodeToString(key)); err != nil {
				tmp.Close()
				return err
			}
			if err := tmp.Chmod(0o600); err != nil {
				tmp.Close()
				return err
			}
			if err := tmp.Close(); err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), path); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote a new gossip key to %s\n", path)
			return nil
		},
	}
}
